-- Release the write lock of a read-write lock (a function of the batch script, see batch.lua; keys
-- in rw_read.lua's header). Writers and readers wait on two channels: writers on `channel`, readers
-- on `channel` .. ':r' (the same `{name}` hash tag, so the same cluster slot). A release that frees
-- the lock wakes one waiting writer per client (release.lua's message '1'), and if no writer waits
-- (the waiting writers' hash is gone), every waiting reader ('*' on the readers' channel): readers
-- woken while a writer waits would only be refused again. undo: the undo of a grant that a refused
-- round of a quorum made, whose messages say so ('~' before each, see batch.lua's 'O').
-- Replies as release.lua's.
local function release_write(lock, waiting, owner, target, channel, publish, undo)
  local released = release(lock, owner, target, channel, publish, undo and '~1' or '1', false)
  if released == 2 and call('EXISTS', waiting) == 0 then
    call(publish, channel .. ':r', undo and '~*' or '*')
  end
  return released
end
