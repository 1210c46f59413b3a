-- Argo CD health check for serving.fleetserve.io/InferenceService.
-- The phases and conditions are those of operator/fleetserve_operator/spec/status.py
-- (RolloutPhase, ConditionType); tests/chart/test_argocd_health.py runs this file in Lua.
local hs = {}

local function condition(conditions, kind)
  for _, c in ipairs(conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

-- The first non-empty argument; select, not ipairs, because ipairs stops at the first nil.
local function first_message(...)
  for i = 1, select("#", ...) do
    local text = select(i, ...)
    if text ~= nil and text ~= "" then
      return text
    end
  end
  return ""
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report a phase"
  return hs
end

local status = obj.status
-- A status written for an older spec says nothing about the current one yet.
if status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. obj.metadata.generation
  return hs
end

local phase = status.phase
local ready = condition(status.conditions, "Ready")
local degraded = condition(status.conditions, "Degraded")
local fallback = condition(status.conditions, "FallbackActive")
local rollout_message = status.rollout and status.rollout.message or nil
local bake = status.rollout and status.rollout.bake or nil

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = first_message(degraded.message, degraded.reason)
elseif phase == "RolledBack" or phase == "Failed" then
  -- RolledBack: the canary was withdrawn and needs a person (a new spec or a retry).
  hs.status = "Degraded"
  hs.message = phase .. ": " .. first_message(rollout_message, status.lastError,
    ready and ready.message, "see kubectl describe")
elseif fallback ~= nil and fallback.status == "True" then
  hs.status = "Degraded"
  hs.message = "Serving from the CPU fallback: " .. first_message(fallback.message, fallback.reason)
elseif phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "Rollout paused at canary weight " .. (status.canaryWeight or 0) .. "%"
elseif phase == "Baking" and bake ~= nil and bake.paused then
  -- A paused bake goes on serving the new version and does not end until resumed.
  hs.status = "Suspended"
  hs.message = "Bake paused: version " .. tostring(status.canaryVersion) .. " serves all traffic"
elseif phase == "Succeeded" and ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = "Serving " .. (status.stableVersion or "the spec") .. " (" .. (status.ready or "ready") .. ")"
elseif phase == "Succeeded" or phase == "Pending" or phase == "Starting"
    or phase == "Progressing" or phase == "Holding" or phase == "Promoting"
    or phase == "Baking" or phase == "Shadowing" then
  hs.status = "Progressing"
  hs.message = phase
  if status.canaryVersion ~= nil then
    hs.message = phase .. ": canary " .. status.canaryVersion .. " at " .. (status.canaryWeight or 0) .. "%"
  end
  if rollout_message ~= nil and rollout_message ~= "" then
    hs.message = hs.message .. " (" .. rollout_message .. ")"
  end
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(phase)
end
return hs
