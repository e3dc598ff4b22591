-- Hand a lock from one hold to another in one step (a function of the batch script, see batch.lua;
-- uses acquire.lua's function): a client passes a lock it releases straight to another owner of its
-- own that waits for it (see `handoff.rs`), so the lock is never free in between and nothing is
-- published (the other clients' waiters are woken by a later release that publishes: `from`'s mark,
-- if a waiter left one, goes to `to`, see acquire.lua).
-- lock, fence: as acquire.lua; from: the releasing hold's field (it goes, whatever its count);
-- to: the receiving hold's field, a new hold (count 1; no token is drawn: a plain lock's holder draws
-- its own when it asks for one, see draw_token.lua); lease: its lease in ms;
-- channel, publish: as release.lua, used only when the lock is left free (see below).
--
-- Set, not incremented: a resend finds `from` gone and `to` holding with count 1, and leaves that.
-- If `from` no longer held the lock (its hold was lost), `to` gets it only if it is free (or marks
-- its holder, as a refused waiter does).
-- Returns {released, 1, previous count of `to` (0), 0} when handed over,
--         {released, 0, remaining ttl in ms} when another owner holds the lock;
-- released: 1 if `from`'s field was there and removed, else 0.
-- A lock hash of another type fails before anything is written. If the acquisition fails after
-- `from` went (a fence of another type, a write refused under `maxmemory`), the release is
-- published as release.lua would, so that no waiter sleeps on a free lock, and the error raised.
local function transfer(lock, fence, from, to, lease, channel, publish)
  -- With its mark, if there was one (2 fields removed).
  local removed = call('HDEL', lock, from, from .. '~')
  local released = removed > 0 and 1 or 0
  local ok, granted, prev_or_ttl, token = pcall(acquire, lock, fence, to, lease, '1', false, true, removed == 2, true)
  if not ok or granted ~= 1 then
    if released == 1 and call('EXISTS', lock) == 0 then
      call(publish, channel, '1')
    end
    if not ok then
      error(granted)
    end
  end
  return {released, granted, prev_or_ttl, token}
end
