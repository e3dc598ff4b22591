-- Helpers shared by the scripts of the batch (see batch.lua) and others that prepend this file.

-- The owner id of a field `owner:generation`.
local function owner_of(field)
  return string.match(field, '^(.*):%d+$')
end

-- Whether `key` is absent or of type `kind`.
local function absent_or(key, kind)
  local found = redis.call('TYPE', key)['ok']
  return found == 'none' or found == kind
end

local function wrong_type()
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
