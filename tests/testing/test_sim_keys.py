"""The management API's keys, and a key past its limit answered as the field answers it.

``POST /keys`` (201, the plaintext key shown once at the top level, ``data.hash`` the id
in the paths), ``GET /keys``, ``GET/PATCH/DELETE /keys/{hash}``, each body checked
against the description; only a management key may call them, and it may not chat.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from _sim_client import SimClient, StartSim
from _sim_contract import contract

from provider_router.testing import DEFAULT_TEST_KEY

MANAGEMENT = "sk-or-v1-management-test-key"
FIXED = {"X-Simulator-Completion-Tokens": "20"}


def check(path: str, method: str, status: int, body: Any) -> None:
    contract().validate(path, method, status, body)


def in_hours(hours: float) -> str:
    moment = datetime.now(UTC) + timedelta(hours=hours)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


async def test_a_made_key_is_shown_once_chats_within_its_limit_and_is_disabled(
    start_sim: StartSim,
) -> None:
    sim, admin = await start_sim(key=MANAGEMENT, management_keys=[MANAGEMENT])
    body = {"name": "job b3", "limit": 0.05, "expires_at": in_hours(24)}
    made = await admin.post("/keys", body)
    assert made.status == 201
    check("/keys", "post", 201, made.json)
    key = made.json["key"]
    data = made.json["data"]
    assert key.startswith("sk-or-v1-")
    assert data["hash"] == hashlib.sha256(key.encode()).hexdigest()
    assert key not in made.text.replace(f'"key":"{key}"', "").replace(f'"key": "{key}"', "")
    assert (data["name"], data["limit"], data["disabled"]) == ("job b3", 0.05, False)
    assert data["label"].startswith("sk-or-v1-")
    assert "..." in data["label"]
    assert data["updated_at"] is None
    assert data["expires_at"] == body["expires_at"]

    worker = SimClient(sim.url, key)
    try:
        assert (await worker.chat(max_tokens=50, headers=FIXED)).status == 200
        seen = await admin.get(f"/keys/{data['hash']}")
        check("/keys/{hash}", "get", 200, seen.json)
        assert 0 < seen.json["data"]["usage"] < 0.05
        own = await worker.get("/key")
        assert own.json["data"]["limit"] == 0.05
        assert own.json["data"]["is_management_key"] is False
        # Over its limit: refused as any key's limit is (402 as documented).
        over = await worker.chat(max_tokens=100_000)
        assert over.status == 402
        assert over.json["error"]["metadata"]["limit_source"] == "openrouter_key_limit"

        disabled = await admin.call("PATCH", f"/keys/{data['hash']}", {"disabled": True})
        assert disabled.status == 200
        check("/keys/{hash}", "patch", 200, disabled.json)
        assert disabled.json["data"]["disabled"] is True
        assert disabled.json["data"]["updated_at"] is not None
        refused = await worker.chat(max_tokens=50)
        assert refused.status == 401  # a disabled key answers 401 (field report)
        listed = await admin.get("/keys")
        check("/keys", "get", 200, listed.json)
        assert data["hash"] not in {k["hash"] for k in listed.json["data"]}
        every = await admin.get("/keys", include_disabled="true")
        assert data["hash"] in {k["hash"] for k in every.json["data"]}

        deleted = await admin.call("DELETE", f"/keys/{data['hash']}")
        assert deleted.status == 200
        check("/keys/{hash}", "delete", 200, deleted.json)
        assert deleted.json == {"deleted": True}
        gone = await admin.get(f"/keys/{data['hash']}")
        assert gone.status == 404
        check("/keys/{hash}", "get", 404, gone.json)
        # Deleted: refused for good, even by an account that takes any key.
        assert (await worker.chat(max_tokens=50)).status == 401
    finally:
        await worker.close()


async def test_only_a_management_key_manages_and_it_never_chats(start_sim: StartSim) -> None:
    sim, admin = await start_sim(key=MANAGEMENT, management_keys=[MANAGEMENT])
    user = SimClient(sim.url, DEFAULT_TEST_KEY)
    try:
        for method, path in (("POST", "/keys"), ("GET", "/keys"), ("GET", "/keys/" + "0" * 64)):
            refused = await user.call(method, path, {"name": "x"} if method == "POST" else None)
            assert refused.status == 403
            assert refused.json["error"]["message"] == (
                "Only management keys can perform this operation"
            )
        check("/keys", "post", 403, refused.json)
    finally:
        await user.close()
    chat = await admin.chat(max_tokens=10)
    assert chat.status == 403
    assert sim.simulator.usage == 0
    own = await admin.get("/key")
    assert own.json["data"]["is_management_key"] is True


@pytest.mark.parametrize(
    ("body", "wrong"),
    [
        ({"limit": 1}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x", "limit": -1}, "limit"),
        ({"name": "x", "limit": "1"}, "limit"),
        ({"name": "x", "limit_reset": "yearly"}, "limit_reset"),
        ({"name": "x", "expires_at": "2030-01-01T00:00Z"}, "expires_at"),  # minutes only
        ({"name": "x", "expires_at": "2030-01-01T00:00:00+02:00"}, "expires_at"),  # not UTC
        ({"name": "x", "include_byok_in_limit": "yes"}, "include_byok_in_limit"),
    ],
)
async def test_a_key_made_wrong_is_a_400_naming_the_field(
    start_sim: StartSim, body: dict[str, Any], wrong: str
) -> None:
    _, admin = await start_sim(key=MANAGEMENT, management_keys=[MANAGEMENT])
    refused = await admin.post("/keys", body)
    assert refused.status == 400
    assert refused.json["error"]["message"].startswith(wrong)
    check("/keys", "post", 400, refused.json)


async def test_an_expired_key_is_refused(start_sim: StartSim) -> None:
    clock = [time.time()]
    sim, admin = await start_sim(
        key=MANAGEMENT, management_keys=[MANAGEMENT], wall_clock=lambda: clock[0]
    )
    made = await admin.post("/keys", {"name": "short", "expires_at": in_hours(1)})
    worker = SimClient(sim.url, made.json["key"])
    try:
        assert (await worker.chat(max_tokens=10)).status == 200
        clock[0] += 2 * 3600
        assert (await worker.chat(max_tokens=10)).status == 401
    finally:
        await worker.close()


async def test_a_key_past_its_limit_answers_the_fields_bare_403(start_sim: StartSim) -> None:
    sim, client = await start_sim(key_limit_status=403, api_keys={DEFAULT_TEST_KEY: "0.001"})
    refused = await client.chat(max_tokens=100_000)
    assert refused.status == 403
    check("/chat/completions", "post", 403, refused.json)
    error = refused.json["error"]
    assert error == {
        "code": 403,
        "message": "Key limit exceeded (total limit). Manage it using "
        "https://openrouter.ai/settings/keys",
    }
    assert sim.requests[-1].limit_source == "openrouter_key_limit"
    assert sim.simulator.usage == Decimal(0)


async def test_a_monthly_key_says_its_window(start_sim: StartSim) -> None:
    sim, admin = await start_sim(key=MANAGEMENT, management_keys=[MANAGEMENT], key_limit_status=403)
    body = {"name": "monthly", "limit": 0.0001, "limit_reset": "monthly"}
    made = await admin.post("/keys", body)
    worker = SimClient(sim.url, made.json["key"])
    try:
        refused = await worker.chat(max_tokens=10_000)
        assert refused.status == 403
        assert refused.json["error"]["message"].startswith("Key limit exceeded (monthly limit)")
    finally:
        await worker.close()
