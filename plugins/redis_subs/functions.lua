#!lua name=nautilus
-- The cluster's writes, run inside Redis so each is atomic (plugins/redis_subs/store.py
-- loads this library with FUNCTION LOAD REPLACE at start).
--
-- Keys, under a prefix P (argument 1 of every function):
--   P.."sub:"<client id>  HASH node, clean ("1"/"0"), subs (msgpack map), ts (ns)
--   P.."node:"<node>      SET of the client ids the node owns
--   P.."cluster"          ZSET node -> last liveness refresh (Redis TIME, ms)
--   P.."nodes"            HASH node -> "<address>\n<boot id>"
--   P.."retain"           HASH topic -> packed retained message; P.."retain_ts" its ts
--   P.."retain_cleared"   ZSET topic -> when it was cleared (Redis TIME, ms), and
--   P.."retain_cleared_ts" HASH topic -> the clear's ts: kept CLEARED_KEPT_MS only
--   P.."changes"          STREAM of every change, numbered by P.."seq" without gaps
--   P.."reaped:"<node>    LIST the last reap's caller, ts and answer (a minute)
--
-- Courier's staleness rule: a write whose timestamp is not newer than the stored one is
-- refused with "stale_request"; a write about a subscriber another node owns, with
-- "unauthorized". Timestamps are nanoseconds as decimal strings: too large for Lua's
-- doubles, so they are compared as strings of digits.

local EMPTY = '\128' -- msgpack: an empty map

local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

local function emit(p, fields)
  local seq = redis.call('INCR', p .. 'seq')
  redis.call('XADD', p .. 'changes', 'MAXLEN', '~', 100000, '*', 's', seq, unpack(fields))
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- register(P, client id, node, clean, ts) -> {previous node or "", resumed, subs}: a
-- session resumes (its subscriptions kept) unless the new connection or the old session
-- is clean (a clean session ends with its connection).
local function register(keys, args)
  local p, cid, node, clean, ts = args[1], args[2], args[3], args[4], args[5]
  local key = p .. 'sub:' .. cid
  local old = redis.call('HMGET', key, 'node', 'subs', 'ts', 'clean')
  if old[3] and not newer(ts, old[3]) then return redis.error_reply('stale_request') end
  local subs = old[2]
  local resumed = subs and clean ~= '1' and old[4] ~= '1'
  if not resumed then subs = EMPTY end
  if old[1] and old[1] ~= node then redis.call('SREM', p .. 'node:' .. old[1], cid) end
  redis.call('SADD', p .. 'node:' .. node, cid)
  redis.call('HSET', key, 'node', node, 'clean', clean, 'subs', subs, 'ts', ts)
  emit(p, {'c', cid, 'n', node, 'k', clean, 'd', subs})
  return {old[1] or '', resumed and 1 or 0, subs}
end

-- set_subscriber(P, client id, node, clean, ts, subs): the owner's record, created if
-- absent (a node writing back its sessions after Redis lost them).
local function set_subscriber(keys, args)
  local p, cid, node, clean, ts, subs = args[1], args[2], args[3], args[4], args[5], args[6]
  local key = p .. 'sub:' .. cid
  local old = redis.call('HMGET', key, 'node', 'ts')
  if old[1] and old[1] ~= node then return redis.error_reply('unauthorized') end
  if old[2] and not newer(ts, old[2]) then return redis.error_reply('stale_request') end
  redis.call('SADD', p .. 'node:' .. node, cid)
  redis.call('HSET', key, 'node', node, 'clean', clean, 'subs', subs, 'ts', ts)
  emit(p, {'c', cid, 'n', node, 'k', clean, 'd', subs})
  return 1
end

-- delete_subscriber(P, client id, node, ts)
local function delete_subscriber(keys, args)
  local p, cid, node, ts = args[1], args[2], args[3], args[4]
  local key = p .. 'sub:' .. cid
  local old = redis.call('HMGET', key, 'node', 'ts')
  if not old[1] then return 0 end
  if old[1] ~= node then return redis.error_reply('unauthorized') end
  if old[2] and not newer(ts, old[2]) then return redis.error_reply('stale_request') end
  redis.call('DEL', key)
  redis.call('SREM', p .. 'node:' .. node, cid)
  emit(p, {'c', cid})
  return 1
end

-- A clear is remembered this long, so that a set older than it that arrives late (from
-- another node's writer) is still refused; then the topic leaves no trace at all.
local CLEARED_KEPT_MS = 60000
local FORGET_BATCH = 1000 -- clears forgotten per call at most

local function forget_old_clears(p, now)
  local cutoff = now - CLEARED_KEPT_MS
  local old = redis.call('ZRANGEBYSCORE', p .. 'retain_cleared', '-inf', cutoff,
                         'LIMIT', 0, FORGET_BATCH)
  if #old > 0 then
    redis.call('HDEL', p .. 'retain_cleared_ts', unpack(old))
    redis.call('ZREM', p .. 'retain_cleared', unpack(old))
  end
end

-- retain(P, topic, ts[, message]): without a message the topic's retained one is cleared.
local function retain(keys, args)
  local p, topic, ts, message = args[1], args[2], args[3], args[4]
  local now = now_ms()
  forget_old_clears(p, now)
  local stored = redis.call('HGET', p .. 'retain_ts', topic)
    or redis.call('HGET', p .. 'retain_cleared_ts', topic)
  if stored and not newer(ts, stored) then return redis.error_reply('stale_request') end
  if message then
    redis.call('HSET', p .. 'retain_ts', topic, ts)
    redis.call('HDEL', p .. 'retain_cleared_ts', topic)
    redis.call('ZREM', p .. 'retain_cleared', topic)
    redis.call('HSET', p .. 'retain', topic, message)
    emit(p, {'t', topic, 'd', message})
  else
    redis.call('HDEL', p .. 'retain', topic)
    redis.call('HDEL', p .. 'retain_ts', topic)
    redis.call('HSET', p .. 'retain_cleared_ts', topic, ts)
    redis.call('ZADD', p .. 'retain_cleared', now, topic)
    emit(p, {'t', topic})
  end
  return 1
end

-- heartbeat(P, node, info) -> {now ms, {node, last ms, ...}, {node, info, ...}}
local function heartbeat(keys, args)
  local p, node, info = args[1], args[2], args[3]
  local now = now_ms()
  redis.call('ZADD', p .. 'cluster', now, node)
  redis.call('HSET', p .. 'nodes', node, info)
  local live = redis.call('ZRANGE', p .. 'cluster', 0, -1, 'WITHSCORES')
  return {now, live, redis.call('HGETALL', p .. 'nodes')}
end

-- position(P) -> {seq, id of the stream's last entry or "0-0"}, as of one moment
local function position(keys, args)
  local p = args[1]
  local last = redis.call('XREVRANGE', p .. 'changes', '+', '-', 'COUNT', 1)
  local id = '0-0'
  if #last > 0 then id = last[1][1] end
  return {tonumber(redis.call('GET', p .. 'seq') or '0'), id}
end

-- reap(P, dead node, this node, limit, dead after ms, ts) -> {"alive"} if the node
-- refreshed its entry meanwhile; {"done"} once it owns nothing (then it is forgotten);
-- else {"moved", client id, subs, ...}: clean sessions deleted, the others now ours.
-- The same call again (same node and ts: the client sent it twice because its
-- connection died before the answer) gets the same "moved" answer, kept in
-- P.."reaped:"<dead>, so that the sessions the first moved are not lost with it.
local function reap(keys, args)
  local p, dead, node, limit, dead_ms, ts = args[1], args[2], args[3], args[4], args[5], args[6]
  local last = p .. 'reaped:' .. dead
  local head = redis.call('LRANGE', last, 0, 1)
  if head[1] == node and head[2] == ts then
    local out = redis.call('LRANGE', last, 2, -1)
    table.insert(out, 1, 'moved')
    return out
  end
  local seen = redis.call('ZSCORE', p .. 'cluster', dead)
  if seen and now_ms() - tonumber(seen) < tonumber(dead_ms) then return {'alive'} end
  local owned = p .. 'node:' .. dead
  local members = redis.call('SRANDMEMBER', owned, tonumber(limit))
  redis.call('DEL', last)
  if #members == 0 then
    redis.call('ZREM', p .. 'cluster', dead)
    redis.call('HDEL', p .. 'nodes', dead)
    return {'done'}
  end
  redis.call('RPUSH', last, node, ts)
  redis.call('EXPIRE', last, 60)
  local out = {'moved'}
  for _, cid in ipairs(members) do
    local key = p .. 'sub:' .. cid
    local record = redis.call('HMGET', key, 'clean', 'subs')
    redis.call('SREM', owned, cid)
    if record[1] == '1' or not record[2] then
      redis.call('DEL', key)
      emit(p, {'c', cid})
    else
      redis.call('HSET', key, 'node', node, 'ts', ts)
      redis.call('SADD', p .. 'node:' .. node, cid)
      emit(p, {'c', cid, 'n', node, 'k', '0', 'd', record[2]})
      redis.call('RPUSH', last, cid, record[2])
      table.insert(out, cid)
      table.insert(out, record[2])
    end
  end
  return out
end

redis.register_function('nautilus_register', register)
redis.register_function('nautilus_set_subscriber', set_subscriber)
redis.register_function('nautilus_delete_subscriber', delete_subscriber)
redis.register_function('nautilus_retain', retain)
redis.register_function('nautilus_heartbeat', heartbeat)
redis.register_function('nautilus_position', position)
redis.register_function('nautilus_reap', reap)
