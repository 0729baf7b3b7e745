-- Argo CD health of flotilla.dev/InferenceClass
-- (argocd-cm key resource.customizations.health.flotilla.dev_InferenceClass).
-- A class is a hardware recipe the solver reads; no controller has to act on it, so a class
-- without status is Healthy. When status carries conditions: Ready=True → Healthy,
-- Ready=False (e.g. InvalidSpec) → Degraded with its message, otherwise Progressing.
-- Lua 5.1 (Argo CD runs gopher-lua).
local hs = {}
local function say(c)
  if c.message ~= nil and c.message ~= "" then return c.reason .. ": " .. c.message end
  return c.reason or c.type
end
local function done(status, message)
  hs.status = status
  hs.message = message
  return hs
end

if obj.status == nil or obj.status.conditions == nil or #obj.status.conditions == 0 then
  return done("Healthy", "Hardware recipe; read by the solver, no status to wait for")
end
local gen = obj.metadata.generation
local seen = obj.status.observedGeneration
if gen ~= nil and seen ~= nil and seen < gen then
  return done("Progressing", "Waiting for flotilla-controller to act on generation " .. gen ..
    " (status is for " .. seen .. ")")
end
for _, c in ipairs(obj.status.conditions) do
  if c.reason == "InvalidSpec" then return done("Degraded", say(c)) end
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    if c.status == "True" then return done("Healthy", say(c)) end
    if c.status == "False" then return done("Degraded", say(c)) end
    return done("Progressing", say(c))
  end
end
return done("Healthy", "No Ready condition; read by the solver")
