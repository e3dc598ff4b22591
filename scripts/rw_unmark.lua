-- A waiting writer stops waiting (a function of the batch script, see batch.lua; keys in
-- rw_read.lua's header): its field of the waiting writers' hash goes. The last waiting writer gone,
-- with no writer holding the lock, lets the readers it held back go: every waiting reader is woken
-- ('*' on the readers' channel, see rw_write_release.lua). A count above zero (the same owner waiting
-- twice) is set, as release.lua sets it.
-- Replies as release.lua's.
local function rw_unmark(waiting, write, field, target, channel, publish)
  if target > 0 then
    return release(waiting, field, target, channel, publish, '1', false)
  end
  if call('HDEL', waiting, field) == 0 then
    return 0
  end
  if call('EXISTS', waiting) == 0 and call('EXISTS', write) == 0 then
    call(publish, channel .. ':r', '*')
  end
  return 2
end
