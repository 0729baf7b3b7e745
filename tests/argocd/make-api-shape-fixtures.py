#!/usr/bin/env python3
"""Writes the *.api-shape.json fixtures: statuses no running controller writes yet (no ModelCache
or CapacityClaim controller; the gateway's Serving condition; a member rejecting an apply). Each
takes a real object captured by capture-fixtures.sh (metadata and spec as the API server
returned them, minus server-set identity) and adds a status in exactly the shape the API types
define (apis/src/cache.rs ModelCacheStatus, claim.rs CapacityClaimStatus, deployment.rs
ModelDeploymentStatus, quota.rs FleetQuotaStatus; reasons from apis/src/constants.rs). tests/helm/install-test.sh applies
each one's status through the status subresource with strict field validation, so a field the
CRD does not define fails the test.

Usage: python3 tests/argocd/make-api-shape-fixtures.py
"""
import copy
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent / "fixtures"
T = "2026-11-29T15:00:00Z"


def base(name):
    obj = json.loads((HERE / name).read_text())
    for k in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
        obj["metadata"].pop(k, None)
    return obj


def cond(type_, status, reason, message, gen=1):
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": gen, "lastTransitionTime": T}


def write(name, obj):
    (HERE / f"{name}.api-shape.json").write_text(json.dumps(obj, indent=4) + "\n")


cache = base("modelcache-no-status.json")
digest = cache["spec"]["digest"]
accepted = cond("Accepted", "True", "AsExpected", "spec accepted; 2 target clusters")

o = copy.deepcopy(cache)
o["status"] = {"observedGeneration": 1, "summary": "2/2 Ready", "conditions": [
    accepted,
    cond("Staged", "True", "AsExpected", "staged and verified in 2 of 2 clusters"),
    cond("Ready", "True", "AsExpected", "2/2 clusters ready")],
    "clusters": [
        {"cluster": "eu-fra-1", "phase": "Ready", "bytes": 140000000000, "digest": digest},
        {"cluster": "eu-par-1", "phase": "Ready", "bytes": 140000000000, "digest": digest}]}
write("modelcache-ready", o)

o = copy.deepcopy(cache)
o["status"] = {"observedGeneration": 1, "summary": "1/2 Ready", "conditions": [
    accepted,
    cond("Staged", "False", "Downloading", "eu-par-1: 61 GB of 140 GB"),
    cond("Ready", "False", "Downloading", "1/2 clusters ready")],
    "clusters": [
        {"cluster": "eu-fra-1", "phase": "Ready", "bytes": 140000000000, "digest": digest},
        {"cluster": "eu-par-1", "phase": "Downloading", "bytes": 61000000000, "reason": "Downloading",
         "message": "61 GB of 140 GB"}]}
write("modelcache-downloading", o)

o = copy.deepcopy(cache)
mismatch = ("eu-par-1: staged files hash to sha256:5d1f..., spec.digest says " + digest[:19] +
            "...; pin spec.revision to the commit the digest was recorded for")
o["status"] = {"observedGeneration": 1, "summary": "1/2 Ready", "conditions": [
    accepted,
    cond("Staged", "False", "DigestMismatch", mismatch),
    cond("Ready", "False", "DigestMismatch", mismatch)],
    "clusters": [
        {"cluster": "eu-fra-1", "phase": "Ready", "bytes": 140000000000, "digest": digest},
        {"cluster": "eu-par-1", "phase": "Failed", "bytes": 140000000000, "digest": "sha256:5d1f" + "0" * 60,
         "reason": "DigestMismatch", "message": "staged files do not match spec.digest"}]}
write("modelcache-digest-mismatch", o)

claim = base("capacityclaim-no-status.json")
claim_accepted = cond("Accepted", "True", "AsExpected", "2 pod sets of 8 devices")


def attempt(class_, ctype, result, message, region="us-east-1"):
    return {"time": T, "provider": "aws", "region": region, "class": class_, "capacityType": ctype,
            "result": result, "message": message}


o = copy.deepcopy(claim)
o["status"] = {"observedGeneration": 1, "devicesRequested": 16, "devicesObtained": 16, "conditions": [
    claim_accepted,
    cond("Provisioning", "False", "AsExpected", "no request in flight"),
    cond("Fulfilled", "True", "FallbackSelected",
         "16 of 16 devices: h200-141g reserved had no capacity, got h100-sxm-80g on-demand"),
    cond("Ready", "True", "AsExpected", "nodes joined us-iad-1")],
    "allocations": [{"podSet": "tp8-replicas", "cluster": "us-iad-1", "pool": "h100", "class": "h100-sxm-80g",
                     "capacityType": "on-demand", "nodes": 2, "pods": 2}],
    "attempts": [attempt("h200-141g", "reserved", "InsufficientCapacity",
                         "InsufficientInstanceCapacity: no p5e.48xlarge in cr-0a1b2c3d4e5f60718"),
                 attempt("h100-sxm-80g", "on-demand", "Fulfilled", "2 x p5.48xlarge launched")]}
write("capacityclaim-fallback-fulfilled", o)

o = copy.deepcopy(claim)
o["status"] = {"observedGeneration": 1, "devicesRequested": 16, "devicesObtained": 0, "conditions": [
    claim_accepted,
    cond("Provisioning", "True", "Provisioning", "asked aws us-east-1 for 2 x p5e.48xlarge (reserved)"),
    cond("Fulfilled", "False", "Provisioning", "0 of 16 devices")]}
write("capacityclaim-provisioning", o)

o = copy.deepcopy(claim)
quota = ("0 of 16 devices: every allowed offering refused; last: aws us-east-1 h100-sxm-80g on-demand: "
         "VcpuLimitExceeded (P instances vCPU quota 192); raise the quota or allow another region")
o["status"] = {"observedGeneration": 1, "devicesRequested": 16, "devicesObtained": 0, "conditions": [
    claim_accepted,
    cond("Provisioning", "False", "AsExpected", "no request in flight"),
    cond("Fulfilled", "False", "QuotaExceeded", quota)],
    "attempts": [attempt("h200-141g", "reserved", "ReservationMismatch", "reservation cr-0a1b2c3d4e5f60718 is in us-east-1b"),
                 attempt("h100-sxm-80g", "on-demand", "QuotaExceeded", "VcpuLimitExceeded")]}
write("capacityclaim-quota-exceeded", o)

o = copy.deepcopy(claim)
o["status"] = {"observedGeneration": 1, "devicesRequested": 16, "devicesObtained": 8, "conditions": [
    claim_accepted,
    cond("Provisioning", "False", "AsExpected", "no request in flight; retrying h200-141g in 3m"),
    cond("Fulfilled", "False", "PartiallyFulfilled", "8 of 16 devices: 1 of 2 pods of tp8-replicas have capacity")],
    "allocations": [{"podSet": "tp8-replicas", "cluster": "us-iad-1", "pool": "h200", "class": "h200-141g",
                     "capacityType": "reserved", "nodes": 1, "pods": 1}]}
write("capacityclaim-partially-fulfilled", o)

o = copy.deepcopy(claim)
drain = ("1 of the 1 surplus node(s) of tp8-replicas-h100-3f2a91c0 (h100-sxm-80g in us-iad-1) still run pods "
         "(spec.disruption.scaleDown: ApplicationDrainOnly): drain ip-10-0-3-17 (1 pod(s)) to release them.")
o["status"] = {"observedGeneration": 2, "devicesRequested": 8, "devicesObtained": 16, "conditions": [
    cond("Fulfilled", "True", "Fulfilled", "Fulfilled: 2 node(s) on-demand h100-sxm-80g in us-iad-1."),
    cond("Provisioning", "False", "Fulfilled", "No provider request is in flight."),
    cond("Ready", "True", "Fulfilled", "Fulfilled: 2 node(s) on-demand h100-sxm-80g in us-iad-1."),
    cond("Surplus", "True", "DrainRequired", drain)],
    "allocations": [{"podSet": "tp8-replicas", "cluster": "us-iad-1", "pool": "tp8-replicas-h100-3f2a91c0",
                     "class": "h100-sxm-80g", "capacityType": "on-demand", "nodes": 2, "pods": 2,
                     "since": T}]}
o["metadata"]["generation"] = 2
write("capacityclaim-drain-required", o)

md = base("modeldeployment-ready.json")
o = copy.deepcopy(md)
for c in o["status"]["conditions"]:
    c["lastTransitionTime"] = T
o["status"]["conditions"].append(
    cond("Serving", "False", "AllEndpointsEjected", "the gateway ejected eu-a after 5 consecutive failures (502)"))
write("modeldeployment-not-serving", o)

o = copy.deepcopy(md)
for c in o["status"]["conditions"]:
    c["lastTransitionTime"] = T
    if c["type"] == "Degraded":
        c.update(status="True", reason="ApplyFailed",
                 message="eu-a: apply failed: Deployment ml/llama-ready-h100: admission webhook "
                         "\"policy.example.com\" denied the request: image registry not allowed")
write("modeldeployment-apply-failed", o)

# Adapters (controllers/src/deployment/adapters.rs writes status.adapters).
o = copy.deepcopy(md)
for c in o["status"]["conditions"]:
    c["lastTransitionTime"] = T
o["spec"]["adapters"] = [{"name": "support-fr", "cacheRef": "support-fr-lora",
                          "sovereignty": {"allowedJurisdictions": ["EU"]}}]
o["status"]["adapters"] = [{"name": "support-fr", "waiting": [
    {"cluster": "eu-a", "reason": "CacheNotReady",
     "message": "ModelCache ml/support-fr-lora is Downloading in eu-a: served here once it is Ready"}]}]
write("modeldeployment-adapter-staging", o)
o["status"]["adapters"] = [{"name": "support-fr", "waiting": [
    {"cluster": "eu-a", "reason": "CacheUnverified",
     "message": "ModelCache ml/support-fr-lora gives no spec.digest: adapters are loaded only from verified files; add the digest"}]}]
write("modeldeployment-adapter-unverified", o)

# FleetQuota (controllers/src/quota.rs writes its status from the plan).
quota = base("fleetquota-no-status.json")
o = copy.deepcopy(quota)
o["status"] = {"observedGeneration": 1, "devices": [{"used": 8, "max": 8}], "summary": "all 8/8",
               "unplacedReplicas": 1, "conditions": [
    cond("Ready", "True", "AsExpected", "enforced in every fleet plan"),
    cond("Exhausted", "True", "QuotaExceeded",
         "1 replica(s) of namespace ml unplaced because of this quota (devices 8/8); their ModelDeployments "
         "say QuotaExceeded")]}
write("fleetquota-exceeded", o)

o = copy.deepcopy(quota)
o["spec"]["devices"] = [{"class": "h100-pcie", "max": 8}]
o["metadata"]["generation"] = 2
o["status"] = {"observedGeneration": 2, "devices": [{"class": "h100-pcie", "used": 0, "max": 8}],
               "summary": "h100-pcie 0/8", "unplacedReplicas": 0, "conditions": [
    cond("Ready", "False", "InvalidSpec",
         "spec.devices[0].class: no InferenceClass \"h100-pcie\"; the limit counts nothing until one exists", 2),
    cond("Exhausted", "False", "AsExpected", "room left: h100-pcie devices 0/8", 2)]}
write("fleetquota-invalid", o)
