"""The Redis ledger's server-side scripts (Lua, run atomically by Redis).

Keys (``P`` is ``<prefix>:{<name>}:``, one cluster slot per ledger): ``P totals``
(limit, spent, reserved, counters), ``P leases`` (open reservation id → lease
deadline), ``P recovered`` (id → units charged at worst case by recovery, ``-1`` once
reconciled), ``P r:<id>`` (one open reservation) and ``P b:<batch>`` (the answer to an
applied batch, so a retried batch is never applied twice).

Lua numbers are doubles, exact only up to 2^53 units, so money never goes through one:
amounts travel as decimal strings of picodollars and the script adds, subtracts and
compares them as two limbs, whole dollars and picodollars (docs/ledger.md, "Redis").
"""

from __future__ import annotations

from typing import Final

FIELDS_PER_OP: Final = 7
"""Each op is ``kind, id, units, key, cost, estimate ('' = none), generation_id``.

They follow six batch arguments: key prefix, clock, lease, owner, batch id, and
how many seconds to remember the batch's answer."""

# ARGV: limit ('' = do not create), a fresh identity. Returns {limit, identity, created}.
INIT: Final = """
local T = KEYS[1]
local limit = redis.call('HGET', T, 'limit')
if limit then
  local id = redis.call('HGET', T, 'identity')
  if not id then
    id = ARGV[2]
    redis.call('HSET', T, 'identity', id)
  end
  return {limit, id, 0}
end
if ARGV[1] == '' then return false end
redis.call('HSET', T, 'limit', ARGV[1], 'spent', 0, 'reserved', 0, 'n_open', 0,
  'n_settled', 0, 'n_released', 0, 'n_recovered', 0, 'estimated', 0, 'drift', 0, 'overrun', 0,
  'identity', ARGV[2])
return {ARGV[1], ARGV[2], 1}
"""

# Kinds and outcomes match provider_router.ledger._group_commit.
BATCH: Final = """
local T, L, REC = KEYS[1], KEYS[2], KEYS[3]
local P, now, lease, owner = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
-- A batch is applied at most once: a retry (its reply was lost) gets the same answer.
local DONE = P .. 'b:' .. ARGV[5]
local seen = redis.call('GET', DONE)
if seen then return cjson.decode(seen) end
local names = {'limit', 'spent', 'reserved', 'n_open', 'n_settled', 'n_released',
  'n_recovered', 'estimated', 'drift', 'overrun'}
local money = {limit = true, spent = true, reserved = true, estimated = true, drift = true,
  overrun = true}

-- Two-limb integers (see the module docstring): value = hi * B + lo, 0 <= lo < B.
local B = 1000000000000
local ZERO = {0, 0}
local function add(a, b)
  local hi, lo = a[1] + b[1], a[2] + b[2]
  if lo >= B then return {hi + 1, lo - B} end
  return {hi, lo}
end
local function sub(a, b)
  local hi, lo = a[1] - b[1], a[2] - b[2]
  if lo < 0 then return {hi - 1, lo + B} end
  return {hi, lo}
end
local function le(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] <= b[2]) end
local function num(text)  -- a decimal integer string (maybe negative) to limbs
  local neg = string.sub(text, 1, 1) == '-'
  if neg then text = string.sub(text, 2) end
  local n = #text
  local v = {0, tonumber(text)}
  if n > 12 then v = {tonumber(string.sub(text, 1, n - 12)), tonumber(string.sub(text, n - 11))} end
  if neg then return sub(ZERO, v) end
  return v
end
local function str(v)  -- limbs to a decimal integer string
  local hi, lo, sign = v[1], v[2], ''
  if hi < 0 then
    sign = '-'
    if lo == 0 then hi = -hi else hi, lo = -hi - 1, B - lo end
  end
  if hi == 0 then return sign .. string.format('%d', lo) end
  return sign .. string.format('%d%012d', hi, lo)
end

local raw = redis.call('HMGET', T, unpack(names))
if not raw[1] then return redis.error_reply('ERR provider-router ledger missing') end
local v = {}
for j = 1, #names do
  if money[names[j]] then v[names[j]] = num(raw[j]) else v[names[j]] = tonumber(raw[j]) end
end

local function charge(held, cost, est)
  v.spent = add(v.spent, cost)
  v.n_settled = v.n_settled + 1
  if est ~= '' then
    local e = num(est)
    v.estimated = add(v.estimated, e)
    v.drift = add(v.drift, sub(cost, e))
  end
  if not le(cost, held) then v.overrun = add(v.overrun, sub(cost, held)) end
end

local function entry(id)
  local f = redis.call('HMGET', P .. 'r:' .. id, 'u', 'k', 'g', 'o')
  return {id, f[1], f[2], f[3] or '', f[4]}
end

local function out(name)
  if money[name] then return str(v[name]) end
  return string.format('%d', v[name])
end

local outcomes, payloads = {}, {}
local n = 0
for i = 7, #ARGV, 7 do
  n = n + 1
  local kind, id, key = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 3]
  local units, est, gen = num(ARGV[i + 2]), ARGV[i + 5], ARGV[i + 6]
  local r, pay = 0, {}
  local R = P .. 'r:' .. id
  if kind == 0 then -- reserve
    if le(add(add(v.spent, v.reserved), units), v.limit) then
      redis.call('HSET', R, 'u', ARGV[i + 2], 'k', key, 'o', owner)
      redis.call('ZADD', L, now + lease, id)
      v.reserved = add(v.reserved, units)
      v.n_open = v.n_open + 1
    elseif le(add(v.spent, units), v.limit) then r = 1 else r = 2 end
  elseif kind == 1 then -- attach
    if redis.call('EXISTS', R) == 1 then redis.call('HSET', R, 'g', gen) else r = 3 end
  elseif kind == 2 or kind == 3 or kind == 8 or kind == 9 then
    local cost = ZERO
    if kind == 2 or kind == 8 then cost = num(ARGV[i + 4]) end
    local held = redis.call('HGET', R, 'u')
    if held then
      held = num(held)
      redis.call('DEL', R)
      redis.call('ZREM', L, id)
      v.reserved = sub(v.reserved, held)
      v.n_open = v.n_open - 1
      if kind == 2 then charge(held, cost, est)
      elseif kind == 3 then v.n_released = v.n_released + 1
      elseif kind == 8 then
        charge(held, cost, '')
        v.n_recovered = v.n_recovered + 1
        redis.call('HSET', REC, id, -1)
      else
        v.spent = add(v.spent, held)
        v.n_recovered = v.n_recovered + 1
        redis.call('HSET', REC, id, str(held))
      end
    else
      local rec = redis.call('HGET', REC, id)
      if rec and rec ~= '-1' and (kind == 2 or kind == 3) then
        -- counted at worst case while its owner was only slow: the truth wins
        local charged = num(rec)
        v.spent = sub(v.spent, charged)
        if kind == 2 then charge(charged, cost, est) else v.n_released = v.n_released + 1 end
        redis.call('HDEL', REC, id)
        r = 4
      elseif rec == '-1' and (kind == 2 or kind == 3) then r = 4
      else r = 3 end
    end
  elseif kind == 4 then -- set limit
    v.limit = units
  elseif kind == 5 then -- snapshot
    for j = 1, #names do pay[j] = out(names[j]) end
  elseif kind == 6 then -- list open
    for _, oid in ipairs(redis.call('ZRANGE', L, 0, -1)) do pay[#pay + 1] = entry(oid) end
  elseif kind == 7 then -- claim expired leases (now is the claimer's clock)
    for _, oid in ipairs(redis.call('ZRANGEBYSCORE', L, '-inf', '(' .. ARGV[i + 4])) do
      local e = entry(oid)
      if e[5] ~= owner then
        redis.call('HSET', P .. 'r:' .. oid, 'o', owner)
        redis.call('ZADD', L, now + lease, oid)
        pay[#pay + 1] = e
      end
    end
  elseif kind == 10 then -- renew one of ours, if it is still open
    redis.call('ZADD', L, 'XX', now + lease, id)
  end
  outcomes[n] = r
  payloads[n] = pay
end
local totals, kv = {}, {}
for j = 1, #names do
  totals[j] = out(names[j])
  kv[#kv + 1] = names[j]
  kv[#kv + 1] = totals[j]
end
redis.call('HSET', T, unpack(kv))
local result = {totals, outcomes, payloads}
redis.call('SET', DONE, cjson.encode(result), 'EX', ARGV[6])
return result
"""
