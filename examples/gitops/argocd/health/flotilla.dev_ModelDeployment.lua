-- Argo CD health of flotilla.dev/ModelDeployment
-- (argocd-cm key resource.customizations.health.flotilla.dev_ModelDeployment).
-- Degraded: a failed placement (InsufficientCapacity, NoEligibleCluster, CostCeilingExceeded),
--   the Degraded condition (ReplicasNotReady: some but not all replicas ready; ApplyFailed),
--   the gateway not serving it, an invalid spec, an adapter whose cache is missing or unverified.
-- Progressing: no status yet, status older than the spec, a capacity claim pending, waiting for
--   a cache (the model's or an adapter's), replicas rolling out or moving between clusters (make-before-break).
-- Healthy: Ready=True (every replica ready, or scaled to zero) and nothing in flight.
-- Lua 5.1 (Argo CD runs gopher-lua): no goto, no integer division, no bit operators.
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
  return done("Progressing", "Waiting for flotilla-controller to place the deployment")
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

local placed = find(conds, "Placed")
if placed ~= nil and placed.status == "False" then
  local capacity = find(conds, "CapacityAvailable")
  if capacity ~= nil and capacity.reason == "ClaimPending" then
    return done("Progressing", say(capacity) .. "; " .. say(placed))
  end
  if placed.reason == "InsufficientCapacity" or placed.reason == "NoEligibleCluster"
      or placed.reason == "CostCeilingExceeded" then
    return done("Degraded", say(placed))
  end
  return done("Progressing", say(placed))
end
local degraded = find(conds, "Degraded")
if degraded ~= nil and degraded.status == "True" then return done("Degraded", say(degraded)) end
local serving = find(conds, "Serving")
if serving ~= nil and (serving.status == "False" or serving.reason == "Degraded") then
  return done("Degraded", say(serving))
end
local cache = find(conds, "WaitingForCache")
if cache ~= nil and cache.status == "True" then return done("Progressing", say(cache)) end

-- LoRA adapters (status.adapters): one whose ModelCache is missing or gives no digest is served
-- nowhere until the spec or the cache changes; one whose cache is not Ready somewhere waits for
-- it. A cluster outside an adapter's policy is by design and says nothing here.
if obj.status.adapters ~= nil then
  local staging = {}
  for _, a in ipairs(obj.status.adapters) do
    for _, w in ipairs(a.waiting or {}) do
      if w.reason == "CacheNotFound" or w.reason == "CacheUnverified" then
        return done("Degraded", "adapter " .. a.name .. ": " .. w.reason .. ": " .. (w.message or ""))
      end
      if w.reason == "CacheNotReady" then table.insert(staging, a.name .. " in " .. w.cluster) end
    end
  end
  if #staging > 0 then
    return done("Progressing", "Adapters wait for their caches: " .. table.concat(staging, ", "))
  end
end

-- A rollout or a move is in flight while some cluster runs other than it should: new replicas
-- not ready yet, or old ones still draining (desired 0) until their replacements are ready.
local moving = {}
if obj.status.placements ~= nil then
  for _, p in ipairs(obj.status.placements) do
    local desired, ready = p.desired or 0, p.ready or 0
    if ready ~= desired then
      local note = p.cluster .. " " .. ready .. "/" .. desired .. " ready"
      if desired < ready then note = note .. " (draining)" end
      table.insert(moving, note)
    end
  end
end
if #moving > 0 then
  return done("Progressing", "Rolling out: " .. table.concat(moving, ", "))
end

local ready = find(conds, "Ready")
if ready ~= nil and ready.status == "True" then
  local message = say(ready)
  if placed ~= nil and placed.reason == "FallbackSelected" then message = message .. "; " .. say(placed) end
  return done("Healthy", message)
end
if ready ~= nil then return done("Progressing", say(ready)) end
return done("Progressing", "Waiting for the Ready condition")
