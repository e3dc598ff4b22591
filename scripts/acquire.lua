-- Take or re-enter a lock (a function of the batch script, see batch.lua; prelude.lua's helpers).
-- lock: the lock hash (field: the hold's owner and generation, `owner:generation`, value: hold count);
-- fence: the fence counter; owner: that field; lease: lease in ms; target: the hold count after this
-- acquisition, a number or its digits (the batch passes its argument's string: a Lua number passed
-- to a command is formatted by `printf`, which costs the server more than the rest of the call's
-- Lua); in_step: the server is one master of a quorum (see the token below); marks: a plain lock,
-- whose waiters mark the hold that refused them (below); carry: the new hold starts marked (a
-- transfer from a marked hold); lazy: a plain lock's acquisition, which draws no token (its holder
-- draws one when it asks for it, see draw_token.lua; the token is then 0). An ended generation of the same owner (a hold lost, a release still
-- on its way) is replaced, its mark carried over; a late request for it then finds nothing and
-- changes nothing.
--
-- A waiter's mark: a refusal of a plain lock (marks) sets the field `holder~` (value 1) beside the
-- holder's field, once per hold, so that the holder's release announces itself (release.lua); a
-- release that finds no mark publishes nothing, as nobody waits. Only ever set beside its hold's
-- field, and removed with it by every script that removes a hold of a plain lock (release.lua,
-- transfer.lua, an ended generation here, force_unlock.lua's DEL, the lease's end).
--
-- The count is *set* to target, never incremented, so a call that runs twice (a resend after a dropped
-- connection) leaves the same state behind. A target of 1 starts a new hold and, unless lazy, draws
-- a new fencing token (prelude.lua's draw_token); a reentrant acquisition returns the current
-- counter (0 when lazy).
--
-- Returns 1, previous count of this owner (0 if none), token when granted,
--         0, remaining ttl in ms when another owner holds the lock:
-- several values, not a table (a table per call costs the server more than its caller's use of it;
-- callers that keep the reply wrap it: `{acquire(...)}`). The token is a number or its decimal
-- digits as a string (the clock's, as read; the client parses either).
-- A lock or fence of another type fails (WRONGTYPE) before anything is written: the lock is read, and
-- the fence read, swapped or incremented (SET ... GET and INCR on another type fail without writing),
-- before any write. A lazy acquisition does not touch the fence.
local function acquire(lock, fence, owner, lease, target, in_step, marks, carry, lazy)
  -- A free lock (the common case) needs no look at its fields: one PTTL (-2: no such key) instead
  -- of HGET and HKEYS; a refusal reports the same PTTL.
  local prev = false
  -- Made only when there is one: a table per call costs the server more than the test.
  local ended = false
  local ttl = call('PTTL', lock)
  if ttl ~= -2 then
    prev = call('HGET', lock, owner)
    if not prev then
      -- Another field is another owner's hold, or an ended generation of this owner (its field
      -- starts with the same `owner:` and only the generation differs): a hold lost, or a release
      -- still on its way. Only the latter is ours to replace; it is removed below, once nothing can
      -- refuse.
      -- A mark belongs to the hold beside it: an ended one's goes with it, and is carried to this
      -- hold (its waiters still wait).
      local holder, ended_marked
      holder, ended, ended_marked = other_fields(lock, owner, marks)
      if holder then
        return 0, ttl
      end
      carry = carry or ended_marked
    end
  end
  -- The fence is read (or written) before the lock is, so that a fence of another type fails the
  -- call before anything is written.
  local token = 0
  if lazy then
    -- A plain lock draws its token only when its holder asks for it (draw_token.lua).
  elseif target == 1 or target == '1' then
    token = draw_token(fence, in_step)
  else
    token = call('GET', fence) or 0
  end

  if ended then
    call('HDEL', lock, unpack(ended))
  end
  if carry then
    call('HSET', lock, owner, target, owner .. '~', '1')
  else
    call('HSET', lock, owner, target)
  end
  call('PEXPIRE', lock, lease)
  return 1, prev and tonumber(prev) or 0, token
end
