-- A small JSON decoder for the health tests (Lua 5.1 to 5.4, no C modules): objects become
-- tables, arrays become sequences (1-based, as Argo CD hands them to health scripts), null
-- becomes nil. Raises an error naming the byte offset on malformed input.
local json = {}

local escapes = {['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t'}

local function utf8char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then
    return string.char(0xC0 + math.floor(cp / 0x40), 0x80 + cp % 0x40)
  end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 0x1000), 0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
  end
  return string.char(0xF0 + math.floor(cp / 0x40000), 0x80 + math.floor(cp / 0x1000) % 0x40,
    0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
end

local function fail(pos, what) error("json: " .. what .. " at byte " .. pos, 0) end

local function skip(s, pos)
  return (string.find(s, "[^ \t\r\n]", pos)) or (#s + 1)
end

local value

local function str(s, pos)
  local out, i = {}, pos + 1
  while true do
    local c = string.sub(s, i, i)
    if c == "" then fail(i, "unterminated string") end
    if c == '"' then return table.concat(out), i + 1 end
    if c == "\\" then
      local e = string.sub(s, i + 1, i + 1)
      if e == "u" then
        local cp = tonumber(string.sub(s, i + 2, i + 5), 16) or fail(i, "bad \\u escape")
        i = i + 6
        if cp >= 0xD800 and cp <= 0xDBFF and string.sub(s, i, i + 1) == "\\u" then
          local lo = tonumber(string.sub(s, i + 2, i + 5), 16) or fail(i, "bad \\u escape")
          cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)
          i = i + 6
        end
        table.insert(out, utf8char(cp))
      else
        table.insert(out, escapes[e] or fail(i, "bad escape"))
        i = i + 2
      end
    else
      local j = string.find(s, '["\\]', i) or fail(i, "unterminated string")
      table.insert(out, string.sub(s, i, j - 1))
      i = j
    end
  end
end

value = function(s, pos)
  pos = skip(s, pos)
  local c = string.sub(s, pos, pos)
  if c == "{" then
    local obj = {}
    pos = skip(s, pos + 1)
    if string.sub(s, pos, pos) == "}" then return obj, pos + 1 end
    while true do
      if string.sub(s, pos, pos) ~= '"' then fail(pos, "expected a key") end
      local k
      k, pos = str(s, pos)
      pos = skip(s, pos)
      if string.sub(s, pos, pos) ~= ":" then fail(pos, "expected ':'") end
      obj[k], pos = value(s, pos + 1)
      pos = skip(s, pos)
      local d = string.sub(s, pos, pos)
      if d == "}" then return obj, pos + 1 end
      if d ~= "," then fail(pos, "expected ',' or '}'") end
      pos = skip(s, pos + 1)
    end
  elseif c == "[" then
    local arr, n = {}, 0
    pos = skip(s, pos + 1)
    if string.sub(s, pos, pos) == "]" then return arr, pos + 1 end
    while true do
      n = n + 1
      arr[n], pos = value(s, pos)
      pos = skip(s, pos)
      local d = string.sub(s, pos, pos)
      if d == "]" then return arr, pos + 1 end
      if d ~= "," then fail(pos, "expected ',' or ']'") end
      pos = pos + 1
    end
  elseif c == '"' then
    return str(s, pos)
  elseif string.sub(s, pos, pos + 3) == "true" then
    return true, pos + 4
  elseif string.sub(s, pos, pos + 4) == "false" then
    return false, pos + 5
  elseif string.sub(s, pos, pos + 3) == "null" then
    return nil, pos + 4
  else
    local num = string.match(s, "^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    if num == nil or num == "" then fail(pos, "unexpected character") end
    return tonumber(num) or fail(pos, "bad number"), pos + #num
  end
end

function json.decode(s)
  local v, pos = value(s, 1)
  if skip(s, pos) <= #s then fail(pos, "trailing data") end
  return v
end

return json
