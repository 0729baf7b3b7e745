-- Runs each Argo CD health script (examples/gitops/argocd/health/<group>_<Kind>.lua) against
-- the fixtures in tests/argocd/fixtures/ as Argo CD does: the object as the global `obj`, the
-- script's return value as the health. Cases come from tests/argocd/cases.tsv:
--   fixture <TAB> expected status <TAB> text the message must contain
-- Usage: lua run.lua <repo root>     Exit status 1 on any failure.
local root = arg[1] or "."
package.path = root .. "/tests/argocd/?.lua;" .. package.path
local json = require("json")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local scripts = {}
local function health(kind, object)
  local chunk = scripts[kind]
  if chunk == nil then
    local path = root .. "/examples/gitops/argocd/health/flotilla.dev_" .. kind .. ".lua"
    chunk = assert(loadstring and loadstring(read(path), "@" .. path) or load(read(path), "@" .. path))
    scripts[kind] = chunk
  end
  obj = object -- Argo CD hands the object to the script as the global `obj`
  local ok, hs = pcall(chunk)
  obj = nil
  if not ok then return nil, hs end
  return hs
end

local failures, cases, seen = 0, 0, {}
for line in io.lines(root .. "/tests/argocd/cases.tsv") do
  if line ~= "" and string.sub(line, 1, 1) ~= "#" then
    local fixture, want, text = string.match(line, "^([^\t]+)\t([^\t]+)\t(.*)$")
    assert(fixture, "cases.tsv: malformed line: " .. line)
    cases = cases + 1
    seen[fixture] = true
    local object = json.decode(read(root .. "/tests/argocd/fixtures/" .. fixture))
    local hs, err = health(object.kind, object)
    local result
    if hs == nil then
      result = "error: " .. tostring(err)
    elseif hs.status ~= want then
      result = "got " .. tostring(hs.status) .. " (" .. tostring(hs.message) .. ")"
    elseif type(hs.message) ~= "string" or hs.message == "" then
      result = "empty message"
    elseif string.find(hs.message, text, 1, true) == nil then
      result = "message \"" .. hs.message .. "\" lacks \"" .. text .. "\""
    end
    if result then
      failures = failures + 1
      print("FAIL " .. fixture .. ": want " .. want .. ": " .. result)
    else
      print("ok   " .. fixture .. ": " .. hs.status .. " (" .. hs.message .. ")")
    end
  end
end
-- Every fixture is used by some case.
local p = io.popen('ls "' .. root .. '/tests/argocd/fixtures"')
for name in p:lines() do
  if string.match(name, "%.json$") and not seen[name] then
    failures = failures + 1
    print("FAIL " .. name .. ": no case in cases.tsv")
  end
end
p:close()
print(string.format("%s: %d cases, %d failed", _VERSION, cases, failures))
os.exit(failures == 0 and 0 or 1)
