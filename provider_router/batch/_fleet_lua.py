"""The work queue's server-side scripts (Lua, each run atomically by Redis).

Keys of one shared plan (``P`` is ``<prefix>:{<name>}:``; the braces keep every
key of one plan in one cluster slot), per dataset ``D``:

- ``P meta``        hash: ``fingerprint`` (which plan), ``loaded`` (``1`` once every
                    prompt was enqueued), ``bad:<D>`` (lines the loader skipped)
- ``P lock``        string: the loader's owner, with an expiry it renews
- ``P s:D``         stream of prompts still to do; consumer group ``workers``
- ``P ids:D``       set: every prompt id ever enqueued (the exactly-once guard)
- ``P done:D``      set: every prompt id completed (a second completion is a duplicate)
- ``P tally:D``     hash: total, completed, out, in, cost (picodollars), duplicates, parked
- ``P parked:D``    hash: prompt id → payload of prompts that failed for good this run

Stream entries carry ``id`` (the prompt id), ``p`` (the prompt as JSON) and ``n``
(how many times it was given back or failed before).
"""

from __future__ import annotations

from typing import Final

ENQUEUE: Final = """
-- KEYS: ids, stream, tally   ARGV: (prompt id, payload)...
local added = 0
for i = 1, #ARGV, 2 do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[2], '*', 'id', ARGV[i], 'p', ARGV[i + 1], 'n', '0')
    added = added + 1
  end
end
if added > 0 then redis.call('HINCRBY', KEYS[3], 'total', added) end
return added
"""

COMPLETE: Final = """
-- KEYS: stream, done, tally   ARGV: group, then (entry id, prompt id, out, in, cost)...
-- Returns {flags, totals}: flags holds 1 per first completion, 0 per duplicate
-- (already done by another worker); totals is the tally's completed, out, in
-- and cost right after (so the worker's view of targets is fresh at each ack).
local out = {}
local t = {completed = 0, out = 0, ['in'] = 0, cost = 0, duplicates = 0}
for i = 2, #ARGV, 5 do
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
  redis.call('XDEL', KEYS[1], ARGV[i])
  if redis.call('SADD', KEYS[2], ARGV[i + 1]) == 1 then
    t.completed = t.completed + 1
    t.out = t.out + tonumber(ARGV[i + 2])
    t['in'] = t['in'] + tonumber(ARGV[i + 3])
    t.cost = t.cost + tonumber(ARGV[i + 4])
    out[#out + 1] = 1
  else
    t.duplicates = t.duplicates + 1
    out[#out + 1] = 0
  end
end
for field, value in pairs(t) do
  if value ~= 0 then redis.call('HINCRBY', KEYS[3], field, string.format('%d', value)) end
end
return {out, redis.call('HMGET', KEYS[3], 'completed', 'out', 'in', 'cost')}
"""

CLAIM_CAPPED: Final = """
-- KEYS: stream, tally   ARGV: group, consumer, count, max_requests ('' = none),
--   target output tokens ('' = none), cap, mean ('' = unknown), spread
-- Claim at most what the dataset's caps leave room for, counting every worker's
-- claimed prompts (the group's pending entries) as well as the completed ones:
-- the fleet's tally decides, atomically, so two workers never both take the last
-- slot. A target admits one more claim while out + price(pending) < target, with
-- price(N) = min(N*cap, N*mean + spread*sqrt(N)) (N*cap while the mean is unknown):
-- the rule of one worker (batch/targets.py), over the whole fleet.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])[1]
local t = redis.call('HMGET', KEYS[2], 'completed', 'out')
local completed = tonumber(t[1] or 0)
local out = tonumber(t[2] or 0)
local n = tonumber(ARGV[3])
if ARGV[4] ~= '' then n = math.min(n, tonumber(ARGV[4]) - completed - pending) end
if ARGV[5] ~= '' then
  local target, cap = tonumber(ARGV[5]), tonumber(ARGV[6])
  local mean, spread = tonumber(ARGV[7]), tonumber(ARGV[8])
  local function price(m)
    local worst = m * cap
    if mean == nil then return worst end
    return math.min(worst, m * mean + spread * math.sqrt(m))
  end
  local k = 0
  while k < n and out + price(pending + k) < target do k = k + 1 end
  n = k
end
if n < 1 then return {} end
local reply = redis.call(
  'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS', KEYS[1], '>')
if not reply then return {} end
return reply[1][2]
"""

GIVE_BACK: Final = """
-- KEYS: stream, parked, tally   ARGV: group, consumer, park (0/1),
--   then (entry id, prompt id, payload, n)...
-- Only entries this consumer still holds are given back (one another worker
-- reclaimed is its business now). park=0 re-adds each to the stream's end;
-- park=1 sets it aside in the parked hash until the next run.
local given = 0
for i = 4, #ARGV, 4 do
  local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #held == 1 then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('XDEL', KEYS[1], ARGV[i])
    if ARGV[3] == '1' then
      redis.call('HSET', KEYS[2], ARGV[i + 1], ARGV[i + 2])
      redis.call('HINCRBY', KEYS[3], 'parked', 1)
    else
      redis.call('XADD', KEYS[1], '*', 'id', ARGV[i + 1], 'p', ARGV[i + 2], 'n', ARGV[i + 3])
    end
    given = given + 1
  end
end
return given
"""

UNPARK: Final = """
-- KEYS: stream, parked, tally   Put every parked prompt back in the stream (once).
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  redis.call('XADD', KEYS[1], '*', 'id', all[i], 'p', all[i + 1], 'n', '0')
end
if #all > 0 then
  redis.call('DEL', KEYS[2])
  redis.call('HINCRBY', KEYS[3], 'parked', -(#all / 2))
end
return #all / 2
"""

TOUCH: Final = """
-- KEYS: stream   ARGV: group, consumer, then (optionally) the entry ids to keep
-- Reset the idle time of the entries this consumer holds (a heartbeat), so no
-- other worker reclaims them; entries others hold are never touched. Given ids,
-- only those of them it holds are touched: an entry the worker lost track of
-- (say a claim whose reply never arrived) then idles out and is reclaimed.
local held = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 100000, ARGV[2])
if #held == 0 then return 0 end
local keep = nil
if #ARGV > 2 then
  keep = {}
  for i = 3, #ARGV do keep[ARGV[i]] = true end
end
local ids = {}
for i = 1, #held do
  if keep == nil or keep[held[i][1]] then ids[#ids + 1] = held[i][1] end
end
for i = 1, #ids, 1000 do
  local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
  for j = i, math.min(i + 999, #ids) do args[#args + 1] = ids[j] end
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end
return #ids
"""

LOCK_RENEW: Final = """
-- KEYS: lock   ARGV: owner, milliseconds    Renew the loader lock if still ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

LOCK_RELEASE: Final = """
-- KEYS: lock   ARGV: owner
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
