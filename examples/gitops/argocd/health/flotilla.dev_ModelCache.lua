-- Argo CD health of flotilla.dev/ModelCache
-- (argocd-cm key resource.customizations.health.flotilla.dev_ModelCache).
-- Healthy: Ready=True (weights staged and digest-verified in every target cluster).
-- Degraded: a failure reason on any condition (InvalidSpec, SourceUnauthorized, SourceNotFound,
--   DigestMismatch, StorageUnavailable, JobFailed), Accepted=False, or a cluster in phase Failed.
-- Progressing: no status yet (no ModelCache controller ships yet: caches stay Progressing),
--   status older than the spec, clusters Pending / Downloading / Verifying, deletion waiting
--   while deployments still use the cache (InUse).
-- Lua 5.1 (Argo CD runs gopher-lua).
local hs = {}
local failures = {InvalidSpec = true, SourceUnauthorized = true, SourceNotFound = true,
  DigestMismatch = true, StorageUnavailable = true, JobFailed = true}
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
  return done("Progressing", "Waiting for the ModelCache controller to start staging")
end
local gen = obj.metadata.generation
local seen = obj.status.observedGeneration
if gen ~= nil and (seen == nil or seen < gen) then
  return done("Progressing", "Waiting for the ModelCache controller to act on generation " .. gen ..
    " (status is for " .. tostring(seen) .. ")")
end
local ready = nil
for _, c in ipairs(obj.status.conditions) do
  if c.status ~= "True" and failures[c.reason] then return done("Degraded", say(c)) end
  if c.type == "Accepted" and c.status == "False" then return done("Degraded", say(c)) end
  if c.type == "Ready" then ready = c end
end
local pending = {}
if obj.status.clusters ~= nil then
  for _, cl in ipairs(obj.status.clusters) do
    if cl.phase == "Failed" then
      local why = cl.reason or "Failed"
      if cl.message ~= nil and cl.message ~= "" then why = why .. ": " .. cl.message end
      return done("Degraded", cl.cluster .. ": " .. why)
    end
    if cl.phase ~= "Ready" then table.insert(pending, cl.cluster .. " " .. tostring(cl.phase)) end
  end
end
for _, c in ipairs(obj.status.conditions) do
  if c.reason == "InUse" then return done("Progressing", say(c)) end
end
if ready ~= nil and ready.status == "True" and #pending == 0 then
  return done("Healthy", obj.status.summary or say(ready))
end
if #pending > 0 then return done("Progressing", "Staging: " .. table.concat(pending, ", ")) end
if ready ~= nil then return done("Progressing", say(ready)) end
return done("Progressing", "Waiting for the Ready condition")
