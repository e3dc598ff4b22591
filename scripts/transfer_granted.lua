-- Record a handoff that the client has granted already (a function of the batch script, see
-- batch.lua): a release of a plain lock that another owner of the same client waits for gives the
-- waiter the lock at once, with a token the client drew itself, and this call catches Redis up (see
-- `handoff.rs`). Until it lands the waiter's lease is the releasing hold's: the lock stays held in
-- Redis throughout, by one hold or the other. The client may also hand the lock on several times
-- before it records the last of them (unrecorded handoffs, see `handoff.rs`): `from` is then the
-- hold Redis last recorded, not the one that released last.
-- lock, fence: as acquire.lua; from: the hold Redis holds the lock by (its field goes, whatever its
-- count); to: the receiving hold's field, a new hold (count 1); lease: its lease in ms; token: the
-- token the client gave it, as digits ('0': none); expect: the fence's value that the client left at its last
-- record ('' when none); fence_to: the fence's value to set, the token or above it (a reserve: the
-- tokens up to it are the client's to hand out before its next record).
--
-- The token is the client's to use if the fence is below it (no later token was drawn) or still
-- at `expect` (the client's own reserve, which nobody drew from since: a fresh acquisition draws
-- above it). Otherwise nothing else is written and the handoff fails.
-- Set, not incremented: a resend finds `from` gone, `to` holding and the fence at `fence_to`, and
-- leaves that.
-- Returns released, granted: released 1 if `from`'s field was there and removed; granted 1 if `to`
-- holds the lock. A handoff that fails leaves the lock as it found it: the client then releases
-- `from` as usual (announcing it to any waiters).
-- A fence or lock of another type fails before anything is written (SET ... GET on another type
-- fails without writing; the lock hash is written only after).
local function transfer_granted(lock, fence, from, to, lease, token, expect, fence_to)
  -- Token '0': none was given (the releasing hold drew none, see draw_token.lua), and the fence is
  -- left alone.
  local counter = token ~= '0' and call('SET', fence, fence_to, 'GET')
  -- Compared as digit strings, as acquire.lua does: a longer string of digits is the larger number.
  if counter and counter ~= expect and (#counter > #token or (#counter == #token and counter >= token)) then
    -- At `fence_to` already is a resend of this call only if `to` holds already.
    if counter ~= fence_to or call('HEXISTS', lock, to) == 0 then
      if counter ~= fence_to then
        call('SET', fence, counter)
      end
      return 0, 0
    end
  end
  -- With its mark, if there was one (2 fields removed): the mark goes to `to`, as its waiters still
  -- wait.
  local removed = call('HDEL', lock, from, from .. '~')
  if removed == 0 then
    -- Not held by `from` (lost), unless a resend finds `to` holding.
    return 0, call('HEXISTS', lock, to)
  end
  if removed == 2 then
    call('HSET', lock, to, '1', to .. '~', '1')
  else
    call('HSET', lock, to, '1')
  end
  call('PEXPIRE', lock, lease)
  return 1, 1
end
