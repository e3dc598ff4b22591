-- Runs a batch of acquisitions and releases in one call: the operations a client queued for one node
-- while its previous call was in flight. prelude.lua and the files of the functions it runs are
-- prepended to this file (see `scripts.rs`): acquire.lua, release.lua, rw_read.lua, rw_write.lua,
-- rw_write_release.lua, rw_unmark.lua, fair_acquire.lua, fair_release.lua, fair_leave.lua,
-- transfer.lua, transfer_granted.lua. A second script, for plain locks only (operations 'a', 'q',
-- 'r', 'p', 'y', 't', 'u'), prepends only prelude.lua, acquire.lua, release.lua, transfer.lua and
-- transfer_granted.lua (`BATCH_PLAIN` in `scripts.rs`): every call
-- defines its functions anew, and most calls need no others. The client sends any other operation
-- to the full script only.
--
-- Every key of one call is in one cluster slot.
-- ARGV[1] the number of operations; ARGV[2] the command that announces a release ('PUBLISH', or
-- 'SPUBLISH' on a cluster); then per operation its arguments (4 unless said), and its keys in KEYS in
-- order:
--   'a', owner, lease ms, target   with KEYS lock, fence                   (see acquire.lua; a
--                                  refusal marks the holder)
--   'q', the same                  as 'a', on a master of a quorum (acquire's in_step)
--   'w', the same                  with KEYS write, fence, readers, waiting (rw_write.lua); 'W' also
--                                  records a waiting writer on refusal, for a fifth argument's ms;
--                                  'v' and 'V' are 'w' and 'W' on a master of a quorum
--   'd', the same                  with KEYS reader, write, readers, waiting (rw_read.lua)
--   'f', the same                  with KEYS lock, fence, queue (fair_acquire.lua); 'F' also
--                                  queues the owner on refusal, its place kept for a fifth
--                                  argument's ms; 'g' and 'G' on a quorum
--   'r', owner, target, channel    with KEYS lock           (see release.lua; wakes one waiter per
--                                  client, published only if a waiter marked the hold)
--   'p', the same                  as 'r', always published (the client has waiters of its own on
--                                  the channel; a semaphore's permit holder, whose waiters leave no
--                                  mark)
--   'y', the same                  as 'r', the undo of a grant that a refused round of a quorum
--                                  made: its message '~1' tells the waiters it wakes that no
--                                  holder released (they wait out a rate limit before they try)
--   'x', the same                  with KEYS reader, readers: a read hold (wakes one writer)
--   'o', the same                  with KEYS write, waiting: a write hold (rw_write_release.lua)
--   'X', 'O'                       'x' and 'o' as undos, as 'y' is 'r's (messages '~1', '~*')
--   'm', the same                  with KEYS waiting, write: a waiting writer's mark (rw_unmark.lua)
--   'h', the same                  with KEYS lock, queue: a fair lock (fair_release.lua)
--   'z', the same                  with KEYS waiter, queue, lock: a fair lock's waiter leaves (fair_leave.lua)
--   't', from, to, lease ms, channel
--                                  with KEYS lock, fence: a lock handed from one hold to another
--                                  (transfer.lua)
--   'u', from, to, lease ms, token, expect, fence_to
--                                  with KEYS lock, fence: a handoff the client granted already,
--                                  with that token (transfer_granted.lua)
-- and the common two in short, since each argument costs the server about 0.1 us (parsed, then
-- made a Lua string; `FCALL`s of 8 and of 120 arguments):
--   'A', owner, lease ms           as 'a' with target 1 (a fresh acquisition); 'Q' as 'q'
--   'R', owner                     as 'r' with target 0 and the channel `lock:released` (see
--                                  `keys.rs`): a plain lock's full release
-- A batch of only those two goes in runs, 'A+' (or 'Q+', of 'Q's) in place of the number of
-- operations: ARGV[2] the publish command, ARGV[3] the lease in ms of every acquisition, ARGV[4]
-- how many acquisitions; then each acquisition's owner, then each release's owner; KEYS lock and
-- fence per acquisition, then lock per release. The acquisitions run first: the client sends in
-- runs no batch with a release of a lock ahead of an acquisition of it.
-- Returns one flat list: per operation, the number of items of its reply, then those items. The reply
-- is acquire's or release's ({code} for a release; {2, subscribers that heard it} for a plain
-- lock's that published; a grant with no previous count in short, {token}: two items fewer for
-- the server to write and the client to read), or {-1, message} when that operation failed
-- (say, WRONGTYPE); the others are not affected. Flat, because every table in a reply costs the
-- server a conversion (a nested reply cost about 0.15 us per call more, a table per operation more
-- still).
-- The clock is read once per call (see prelude.lua): where this loop is a function of relock's
-- library (see `scripts.rs`), the helpers' state outlives the call, so it is cleared first.
clock_reading = false
call = redis.call
-- A lone fresh acquisition of a plain lock in short (most calls while few operations are in
-- flight): ARGV is 'A' (or 'Q' on a master of a quorum), owner, lease ms; KEYS lock, fence. A
-- grant with no previous count answers its token alone, not in a list: every argument and a
-- table reply cost the server more than the rest of such a call's Lua (callgrind of
-- the server, pipelined: per acquisition, about 1,700 instructions an argument and 6,900 for a
-- table of two items, of 66,000 for an acquisition and its release). Any other outcome answers
-- as the single operation below does; an error is the call's.
local first = ARGV[1]
if first == 'A' or first == 'Q' then
  local reply, second, third = acquire(KEYS[1], KEYS[2], ARGV[2], ARGV[3], '1', first == 'Q', true, false, true)
  if reply == 1 and second == 0 then
    return third
  elseif third ~= nil then
    return {3, reply, second, third}
  end
  return {2, reply, second}
end
local out = {}
local n = 0
local k = 1
local a = 3
local publish = ARGV[2]
if publish ~= 'PUBLISH' and publish ~= 'SPUBLISH' then
  return redis.error_reply('ERR relock batch: unknown publish command')
end
-- Runs of fresh acquisitions, then of full releases (see above; most batches under load): three
-- arguments fewer per acquisition and release than one by one, and no operation codes to test.
-- About 9 % less of the server's cost of a cycle than the loop below (callgrind of the
-- server, pipelined batches of 8 acquisitions, then of their 8 releases), of which a third is the
-- loop's own tests. The same replies as the loop's, built inline as there: one helper function
-- for both, defined once with the library, cost the server about 2,200 instructions more per
-- cycle here (4 %) and 600 in the loop (measured the same way).
if first == 'A+' or first == 'Q+' then
  local lease = ARGV[3]
  local in_step = first == 'Q+'
  a = 5
  for _ = 1, tonumber(ARGV[4]) do
    local ok, reply, second, third = pcall(acquire, KEYS[k], KEYS[k + 1], ARGV[a], lease, '1', in_step, true, false, true)
    k = k + 2
    a = a + 1
    if not ok then
      out[n + 1] = 2
      out[n + 2] = -1
      out[n + 3] = type(reply) == 'table' and reply.err or tostring(reply)
      n = n + 3
    elseif reply == 1 and second == 0 then
      -- A fresh grant in short: its token alone.
      out[n + 1] = 1
      out[n + 2] = third
      n = n + 2
    elseif third ~= nil then
      out[n + 1] = 3
      out[n + 2] = reply
      out[n + 3] = second
      out[n + 4] = third
      n = n + 4
    else
      out[n + 1] = 2
      out[n + 2] = reply
      out[n + 3] = second
      n = n + 3
    end
  end
  for i = a, #ARGV do
    local ok, reply, second = pcall(release, KEYS[k], ARGV[i], 0, false, publish, '1', false, true)
    k = k + 1
    if not ok then
      out[n + 1] = 2
      out[n + 2] = -1
      out[n + 3] = type(reply) == 'table' and reply.err or tostring(reply)
      n = n + 3
    elseif second ~= nil then
      out[n + 1] = 2
      out[n + 2] = reply
      out[n + 3] = second
      n = n + 3
    else
      out[n + 1] = 1
      out[n + 2] = reply
      n = n + 2
    end
  end
  return out
end
-- One plain operation (most calls, while few operations are in flight): its reply is built at once.
-- Cheaper for the server than the loop below, with its reply list grown one item at a time, by
-- about 0.4 us a call (measured, pipelined). The same calls and replies as the loop's, but for an
-- error: no pcall here (one costs about 60 ns), so an operation's error (say, WRONGTYPE) is the
-- call's, which the client reads as that operation's, as it reads {-1, message} from the loop.
if ARGV[1] == '1' then
  local op = ARGV[3]
  local ran, reply, second, third = true, nil, nil, nil
  if op == 'A' or op == 'Q' then
    reply, second, third = acquire(KEYS[1], KEYS[2], ARGV[4], ARGV[5], '1', op == 'Q', true, false, true)
  elseif op == 'R' then
    reply, second = release(KEYS[1], ARGV[4], 0, false, publish, '1', false, true)
  elseif op == 'a' or op == 'q' then
    reply, second, third = acquire(KEYS[1], KEYS[2], ARGV[4], ARGV[5], ARGV[6], op == 'q', true, false, true)
  elseif op == 'r' or op == 'p' or op == 'y' then
    reply, second = release(KEYS[1], ARGV[4], tonumber(ARGV[5]), ARGV[6], publish, op == 'y' and '~1' or '1', false, op ~= 'p')
  elseif op == 'u' then
    reply, second = transfer_granted(KEYS[1], KEYS[2], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
  else
    ran = false
  end
  -- An operation that ran is answered here, whatever it gave, as the loop answers it: falling
  -- through would run it twice.
  if ran then
    if third ~= nil then
      -- A fresh grant in short: its token alone (see the reply above).
      if reply == 1 and second == 0 then
        return {1, third}
      end
      return {3, reply, second, third}
    elseif second ~= nil then
      return {2, reply, second}
    elseif type(reply) == 'number' then
      return {1, reply}
    elseif type(reply) == 'table' and not reply.err then
      return {#reply, unpack(reply)}
    end
    return {2, -1, type(reply) == 'table' and reply.err or tostring(reply)}
  end
end
-- Plain comparisons, not lookup tables: tables built on every call cost more than the tests.
for _ = 1, tonumber(ARGV[1]) do
  -- A plain acquisition or release (the common operations) replies with several values, the
  -- others with a table: ok, then either.
  local ok, reply, second, third
  local op = ARGV[a]
  -- How many arguments the operation takes, itself included. The operations with a fifth argument
  -- (the lifetime of the mark a refusal leaves; a transfer's channel) are rare: tested only past
  -- the plain ones.
  local width = 4
  local five = false
  if op == 'A' or op == 'Q' then
    ok, reply, second, third = pcall(acquire, KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], '1', op == 'Q', true, false, true)
    k = k + 2
    width = 3
  elseif op == 'R' then
    ok, reply, second = pcall(release, KEYS[k], ARGV[a + 1], 0, false, publish, '1', false, true)
    k = k + 1
    width = 2
  elseif op == 'a' or op == 'q' then
    ok, reply, second, third = pcall(acquire, KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], op == 'q', true, false, true)
    k = k + 2
  elseif op == 'r' or op == 'p' or op == 'y' then
    ok, reply, second = pcall(release, KEYS[k], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3], publish,
      op == 'y' and '~1' or '1', false, op ~= 'p')
    k = k + 1
  elseif op == 'u' then
    ok, reply, second = pcall(transfer_granted, KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
      ARGV[a + 5], ARGV[a + 6])
    k = k + 2
    width = 7
  else
    five = op == 'W' or op == 'V' or op == 'F' or op == 'G' or op == 't'
    if op == 'w' or op == 'W' or op == 'v' or op == 'V' then
      ok, reply = pcall(acquire_write, KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1],
        tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), op == 'v' or op == 'V', five and tonumber(ARGV[a + 4]))
      k = k + 4
    elseif op == 'd' then
      ok, reply = pcall(acquire_read, KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1],
        tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]))
      k = k + 4
    elseif op == 'f' or op == 'F' or op == 'g' or op == 'G' then
      ok, reply = pcall(acquire_fair, KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[a + 1], tonumber(ARGV[a + 2]),
        tonumber(ARGV[a + 3]), op == 'g' or op == 'G', five and tonumber(ARGV[a + 4]), publish)
      k = k + 3
    elseif op == 't' then
      ok, reply = pcall(transfer, KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]),
        ARGV[a + 4], publish)
      k = k + 2
    elseif op == 'h' or op == 'o' or op == 'O' or op == 'm' then
      -- The releases with two keys: a fair lock's, a write hold's, a waiting writer's mark.
      local run = (op == 'h' and release_fair) or ((op == 'o' or op == 'O') and release_write) or rw_unmark
      ok, reply = pcall(run, KEYS[k], KEYS[k + 1], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3], publish,
        op == 'O')
      k = k + 2
    elseif op == 'z' then
      ok, reply = pcall(fair_leave, KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[a + 1], tonumber(ARGV[a + 2]),
        ARGV[a + 3], publish)
      k = k + 3
    elseif op == 'x' or op == 'X' then
      -- A read hold's release: its code only (how many heard it is not passed on).
      ok, reply = pcall(release, KEYS[k], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3], publish,
        op == 'X' and '~1' or '1', KEYS[k + 1])
      k = k + 2
    else
      ok, reply = false, 'ERR relock batch: unknown operation'
    end
  end
  a = a + (five and 5 or width)
  if ok and type(reply) == 'number' then
    -- A plain operation's values (a release's code, and how many heard it when it published; an
    -- acquisition's code and its one or two values), or another release's code.
    if third ~= nil and reply == 1 and second == 0 then
      -- A fresh grant in short: its token alone.
      out[n + 1] = 1
      out[n + 2] = third
      n = n + 2
    elseif third ~= nil then
      out[n + 1] = 3
      out[n + 2] = reply
      out[n + 3] = second
      out[n + 4] = third
      n = n + 4
    elseif second ~= nil then
      out[n + 1] = 2
      out[n + 2] = reply
      out[n + 3] = second
      n = n + 3
    else
      out[n + 1] = 1
      out[n + 2] = reply
      n = n + 2
    end
  elseif ok and type(reply) == 'table' and not reply.err then
    out[n + 1] = #reply
    for j = 1, #reply do
      out[n + 1 + j] = reply[j]
    end
    n = n + 1 + #reply
  else
    -- A failed call raised (not ok), or a function returned an error reply (a key of another
    -- type): a table with `err`; anything else is no reply of an operation.
    out[n + 1] = 2
    out[n + 2] = -1
    out[n + 3] = type(reply) == 'table' and reply.err or tostring(reply)
    n = n + 3
  end
end
return out
