-- Argo CD health of a kuberl RLJob (kuberl.io/v1alpha1), from status.phase.
-- Install: docs/gitops.md (argocd-cm key resource.customizations.health.kuberl.io_RLJob).
--   Succeeded                                  -> Healthy
--   Pending, Starting, Running, Restarting     -> Progressing
--   Failed                                     -> Degraded
--   Queued (Kueue holds the RayJob)            -> Suspended: waiting for quota, not failing
--   Suspended                                  -> Suspended
--   no status yet, or a status older than the spec (observedGeneration < generation) -> Progressing
--   a refused spec change (condition SpecChangeRefused=True) on a job still going -> Degraded: the
--     commit in git will not take effect until it is reverted or the job is recreated.
--   nothing can start (condition Created=False: an invalid spec, a child the API server refuses,
--     KubeRay missing) -> Degraded, not Progressing forever: it needs a fix, not time.
local health = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function message_for(status, kind, fallback)
  local c = condition(status, kind)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil or status.phase == nil then
  health.status = "Progressing"
  health.message = "Waiting for the kuberl operator to pick the job up"
  return health
end

local phase = status.phase
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  health.status = "Progressing"
  health.message = "Waiting for the operator to act on generation " .. tostring(generation)
  return health
end

if phase == "Succeeded" then
  health.status = "Healthy"
  health.message = message_for(status, "Succeeded", "The job succeeded")
  return health
end
if phase == "Failed" then
  health.status = "Degraded"
  health.message = message_for(status, "Failed", "The job failed")
  return health
end

local created = condition(status, "Created")
if created ~= nil and created.status == "False" and phase ~= "Suspended" then
  health.status = "Degraded"
  health.message = "Cannot start (" .. tostring(created.reason) .. "): " .. (created.message or "")
  return health
end

local refused = condition(status, "SpecChangeRefused")
if refused ~= nil and refused.status == "True" then
  health.status = "Degraded"
  health.message = "Spec change refused: " .. (refused.message or "")
  return health
end

if phase == "Queued" then
  health.status = "Suspended"
  health.message = message_for(status, "Queued", "The job waits in its Kueue queue")
  return health
end
if phase == "Suspended" then
  health.status = "Suspended"
  health.message = message_for(status, "Suspended", "The job is suspended (spec.runPolicy.suspend)")
  return health
end
if phase == "Pending" or phase == "Starting" or phase == "Running" or phase == "Restarting" then
  health.status = "Progressing"
  local fallback = "Phase " .. phase
  if status.progress ~= nil and status.progress.step ~= nil and status.progress.totalSteps ~= nil then
    fallback = "Phase " .. phase .. ", step " .. tostring(status.progress.step) .. "/" .. tostring(status.progress.totalSteps)
  end
  health.message = fallback
  return health
end

health.status = "Unknown"
health.message = "Unknown phase " .. tostring(phase)
return health
