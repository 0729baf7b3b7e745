-- Argo CD health of flotilla.dev/CapacityClaim
-- (argocd-cm key resource.customizations.health.flotilla.dev_CapacityClaim).
-- Healthy: Fulfilled=True (reason Fulfilled, or FallbackSelected: obtained with a later class
--   or capacity type, said in the message), or Ready=True.
-- Degraded: a failure reason (CapacityUnavailable, QuotaExceeded, ReservationMismatch, Expired,
--   Interrupted, InvalidSpec), Accepted=False, or PartiallyFulfilled with no request in flight.
-- Progressing: no status yet (the controller runs only with a capacity provider configured),
--   status older than the spec, Provisioning=True, surplus waiting for the application to drain
--   (Surplus=True DrainRequired; also while a deleted claim waits for it).
-- Lua 5.1 (Argo CD runs gopher-lua).
local hs = {}
local failures = {CapacityUnavailable = true, QuotaExceeded = true, ReservationMismatch = true,
  Expired = true, Interrupted = true, InvalidSpec = true}
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
  return done("Progressing", "Waiting for the CapacityClaim controller to ask a provider")
end
local gen = obj.metadata.generation
local seen = obj.status.observedGeneration
if gen ~= nil and (seen == nil or seen < gen) then
  return done("Progressing", "Waiting for the CapacityClaim controller to act on generation " .. gen ..
    " (status is for " .. tostring(seen) .. ")")
end
local conds = obj.status.conditions
for _, c in ipairs(conds) do
  if c.status ~= "True" and failures[c.reason] then return done("Degraded", say(c)) end
  if c.type == "Accepted" and c.status == "False" then return done("Degraded", say(c)) end
end
local provisioning = find(conds, "Provisioning")
if provisioning ~= nil and provisioning.status == "True" then return done("Progressing", say(provisioning)) end
for _, c in ipairs(conds) do
  if c.reason == "DrainRequired" then return done("Progressing", say(c)) end
end
local fulfilled = find(conds, "Fulfilled")
if fulfilled ~= nil and fulfilled.status == "True" then return done("Healthy", say(fulfilled)) end
if fulfilled ~= nil and fulfilled.reason == "PartiallyFulfilled" then return done("Degraded", say(fulfilled)) end
local ready = find(conds, "Ready")
if ready ~= nil and ready.status == "True" then return done("Healthy", say(ready)) end
if fulfilled ~= nil then return done("Progressing", say(fulfilled)) end
return done("Progressing", "Waiting for the Fulfilled condition")
