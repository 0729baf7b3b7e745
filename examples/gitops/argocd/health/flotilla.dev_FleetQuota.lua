-- Argo CD health of flotilla.dev/FleetQuota
-- (argocd-cm key resource.customizations.health.flotilla.dev_FleetQuota).
-- A quota is enforced by the solver in every fleet plan; flotilla-controller writes what the
-- plan uses of it. No status yet, or one for an older generation → Progressing; Ready=False
-- (InvalidSpec: an unknown class, a limit counted twice) → Degraded with its message. A quota
-- that binds (Exhausted=True: QuotaExceeded, AtLimit) is doing its job → Healthy, saying so;
-- the deployments it holds back say QuotaExceeded themselves.
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
  return done("Progressing", "Waiting for flotilla-controller to write the quota's usage")
end
local gen = obj.metadata.generation
local seen = obj.status.observedGeneration
if gen ~= nil and seen ~= nil and seen < gen then
  return done("Progressing", "Waiting for flotilla-controller to act on generation " .. gen ..
    " (status is for " .. seen .. ")")
end
local ready, exhausted = nil, nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then ready = c end
  if c.type == "Exhausted" then exhausted = c end
end
if ready ~= nil and ready.status == "False" then return done("Degraded", say(ready)) end
if ready == nil or ready.status ~= "True" then
  return done("Progressing", "Waiting for flotilla-controller to judge the quota")
end
if exhausted ~= nil and exhausted.status == "True" then return done("Healthy", say(exhausted)) end
if obj.status.summary ~= nil then return done("Healthy", "Enforced; used: " .. obj.status.summary) end
return done("Healthy", say(ready))
