-- Argo CD health of flotilla.dev/InferenceCluster
-- (argocd-cm key resource.customizations.health.flotilla.dev_InferenceCluster).
-- Healthy: Ready=True (the member answers and its capacity is observed).
-- Degraded: Ready=False with the reason of the condition that is not (SecretMissing,
--   SecretInvalid, Unauthorized, Unreachable, NoMatchingNodes, UnknownClass, CapacityStale,
--   InvalidSpec) and its message.
-- Progressing: no status yet, status older than the spec, Ready Unknown or Pending.
-- Lua 5.1 (Argo CD runs gopher-lua).
local hs = {}
local function find(conds, t)
  for _, c in ipairs(conds) do
    if c.type == t then return c end
  end
  return nil
end
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
  return done("Progressing", "Waiting for flotilla-controller to observe the member cluster")
end
local gen = obj.metadata.generation
local seen = obj.status.observedGeneration
if gen ~= nil and (seen == nil or seen < gen) then
  return done("Progressing", "Waiting for flotilla-controller to act on generation " .. gen ..
    " (status is for " .. tostring(seen) .. ")")
end
local conds = obj.status.conditions
for _, c in ipairs(conds) do
  if c.reason == "InvalidSpec" then return done("Degraded", say(c)) end
end
local ready = find(conds, "Ready")
if ready == nil then return done("Progressing", "Waiting for the Ready condition") end
if ready.status == "True" then
  local capacity = find(conds, "CapacityKnown")
  if capacity ~= nil and capacity.message ~= nil and capacity.message ~= "" then
    return done("Healthy", ready.message .. "; " .. capacity.message)
  end
  return done("Healthy", say(ready))
end
if ready.status == "Unknown" or ready.reason == "Pending" then return done("Progressing", say(ready)) end
return done("Degraded", say(ready))
