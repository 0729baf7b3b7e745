#!/usr/bin/env python3
"""Placement quality against an exact optimum (OR-Tools CP-SAT).

Reads the JSON lines `cargo run --release -p flotilla-placement --example quality_export`
writes (each: the problem as the solver sees it after filtering, and where our plan put each
deployment's replicas), builds for each fleet an integer model under the same hard
constraints, computes the lexicographic optimum (priority tiers first, highest first, then
total replicas), and reports mean and worst gap, the fleets where the optimum is proven, and
the fleets where a higher tier loses replicas that an optimum gives it.

What the model encodes (documented in docs/benchmarks.md):
  * options: only (pool, alternative) pairs that passed the solver's filters (cluster
    selector, sovereignty, readiness, cordon, taints, claim ownership, device match, node
    fit, capacity type, price) -- exported by the Rust side, not re-derived here;
  * replicas per deployment <= spec.replicas; maxReplicas per alternative; maxCostPerHour;
  * devices per node: pods of every deployment packed into each pool's nodes. Nodes with the
    same free count form a group whose capacity is summed; this is exact because pod sizes
    form a divisibility chain (1, 2, 4, 8) that divides the group's free count (otherwise
    the group is split into single nodes). Pods of a multi-node replica go to distinct nodes
    (at most `x` pods of an option per node, `x` its replica count);
  * spread with the solver's semantics: a domain may exceed another by more than maxSkew
    only when the other could take no further replica of the deployment once the
    deployments solved before it (priority, then creation) and itself were placed: every
    option there has a full pool, an alternative at its maxReplicas, or a price that one
    more replica would take over maxCostPerHour. "Full" is counted on devices per node
    group: exact for one-pod replicas, approximate (total free devices) for multi-pod ones.
    The optimum uses the problem's order; our plan is checked against the model in the order
    the plan solved its tiers in (the export's `solveOrder`: a same-tier trade changes it);
  * not encoded: minReplicas per alternative (a preference the plan reports as unmet, not a
    constraint), preferences between options (capacity type, price, fallback order, cache,
    stickiness): the optimum is about how many replicas fit, not where.
"""

import argparse
import json
import sys
from collections import defaultdict

from ortools.sat.python import cp_model


def groups(free_per_node, sizes):
    """Node groups of a pool: (free, count), split to single nodes when summing is not exact."""
    counts = defaultdict(int)
    for f in free_per_node:
        if f > 0:
            counts[f] += 1
    chain = sorted(set(sizes))
    divisible = all(b % a == 0 for a, b in zip(chain, chain[1:]))
    out = []
    for free, n in sorted(counts.items()):
        fits = [s for s in chain if s <= free]
        exact = n == 1 or (divisible and all(free % s == 0 for s in fits))
        out.extend([(free, n)] if exact else [(free, 1)] * n)
    return out


class Model:
    """The fleet as a CP-SAT model; `x[d][k]` replicas of deployment d on its option k."""

    def __init__(self, problem, order=None):
        self.p = problem
        # Position of each deployment in the solve order (spread judges a pool full against the
        # deployments solved before): the problem's order unless the plan solved a tier in
        # another one (a same-tier trade, `solveOrder` of the export).
        self.pos = list(range(len(problem["deployments"])))
        for k, di in enumerate(order or []):
            self.pos[di] = k
        self.m = cp_model.CpModel()
        m, deps, pools = self.m, problem["deployments"], problem["pools"]
        sizes = [s for d in deps for s in d["pods"]]
        self.groups = [groups(p["freePerNode"], sizes) for p in pools]
        self.x = []
        used = defaultdict(list)  # (pool, group) -> [(size, var)]
        for di, d in enumerate(deps):
            xs = [m.NewIntVar(0, d["replicas"], f"x{di}_{k}") for k in range(len(d["options"]))]
            self.x.append(xs)
            m.Add(sum(xs) <= d["replicas"])
            for r, (_, most) in enumerate(d["alternatives"]):
                if most is not None:
                    m.Add(sum(x for x, o in zip(xs, d["options"]) if o["rank"] == r + 1) <= most)
            if d["maxCostMicros"] is not None:
                m.Add(sum(o["priceMicros"] * x for x, o in zip(xs, d["options"])) <= d["maxCostMicros"])
            mult = defaultdict(int)
            for s in d["pods"]:
                mult[s] += 1
            for k, o in enumerate(d["options"]):
                gs = self.groups[o["pool"]]
                for s, times in mult.items():
                    zs = []
                    for gi, (free, n) in enumerate(gs):
                        if free < s:
                            continue
                        z = m.NewIntVar(0, d["replicas"] * times, f"z{di}_{k}_{gi}_{s}")
                        if d["distinctNodes"]:
                            m.Add(z <= n * xs[k])
                        zs.append(z)
                        used[(o["pool"], gi)].append((di, s, z))
                    m.Add(sum(zs) == times * xs[k]) if zs else m.Add(xs[k] == 0)
        self.used = used
        for pi, gs in enumerate(self.groups):
            for gi, (free, n) in enumerate(gs):
                m.Add(sum(s * z for _, s, z in used[(pi, gi)]) <= free * n)
        for di, d in enumerate(deps):
            if d["spread"] is not None:
                self.spread(di, d)

    def remaining(self, pi, gi, upto):
        """Free devices of a node group once the deployments solved up to `upto` are placed."""
        free, n = self.groups[pi][gi]
        return free * n - sum(s * z for di, s, z in self.used[(pi, gi)] if self.pos[di] <= self.pos[upto])

    def spread(self, di, d):
        m, kind, skew = self.m, d["spread"][0], d["spread"][1]
        pools = self.p["pools"]
        by_domain = defaultdict(list)
        for k, o in enumerate(d["options"]):
            by_domain[pools[o["pool"]]["domains"][kind]].append(k)
        if len(by_domain) < 2:
            return
        largest, total = max(d["pods"]), sum(d["pods"])
        xs, opts = self.x[di], d["options"]
        n = {dom: sum(xs[k] for k in ks) for dom, ks in by_domain.items()}
        # Why an option can take no further replica of the deployment: its pool is full (once
        # the deployments solved up to this one are placed), its alternative is at maxReplicas,
        # or one more replica at its price would pass the ceiling. Each is a literal that may
        # be true only when the reason holds.
        full = {}
        for pi in sorted({o["pool"] for o in opts}):
            full[pi] = m.NewBoolVar(f"full{di}_{pi}")
            room = [(gi, free) for gi, (free, _) in enumerate(self.groups[pi]) if free >= largest]
            if len(d["pods"]) == 1:
                for gi, _ in room:
                    m.Add(self.remaining(pi, gi, di) <= largest - 1).OnlyEnforceIf(full[pi])
            elif room:
                left = sum(self.remaining(pi, gi, di) for gi, _ in room)
                m.Add(left <= total - 1).OnlyEnforceIf(full[pi])
        at_max = {}
        for r, (_, most) in enumerate(d["alternatives"]):
            if most is not None:
                at_max[r + 1] = m.NewBoolVar(f"atmax{di}_{r + 1}")
                m.Add(sum(x for x, o in zip(xs, opts) if o["rank"] == r + 1) >= most).OnlyEnforceIf(at_max[r + 1])
        broke = {}
        if d["maxCostMicros"] is not None:
            spent = sum(o["priceMicros"] * x for x, o in zip(xs, opts))
            for price in sorted({o["priceMicros"] for o in opts}):
                broke[price] = m.NewBoolVar(f"broke{di}_{price}")
                m.Add(spent + price >= d["maxCostMicros"] + 1).OnlyEnforceIf(broke[price])
        for dom, ks in by_domain.items():
            # open[dom] is forced true while any option of the domain can take one more
            # replica: it has room, its alternative is under maxReplicas, and the replica is
            # affordable under the ceiling.
            is_open = m.NewBoolVar(f"open{di}_{dom}")
            for k in ks:
                o = opts[k]
                why = [full[o["pool"]]]
                if o["rank"] in at_max:
                    why.append(at_max[o["rank"]])
                if o["priceMicros"] in broke:
                    why.append(broke[o["priceMicros"]])
                m.AddBoolOr([is_open] + why)
            for other in by_domain:
                if other != dom:
                    m.Add(n[other] <= n[dom] + skew).OnlyEnforceIf(is_open)

    def tiers(self):
        deps = self.p["deployments"]
        return sorted({d["priority"] for d in deps}, reverse=True)

    def tier_sum(self, tier):
        return sum(sum(xs) for xs, d in zip(self.x, self.p["deployments"]) if d["priority"] == tier)

    def optimum(self, seconds):
        """Per tier (highest first) the most replicas, each fixed before the next; and whether
        every step was proven optimal."""
        best, proven = {}, True
        for tier in self.tiers():
            self.m.Maximize(self.tier_sum(tier))
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = seconds
            solver.parameters.num_workers = 2
            solver.parameters.random_seed = 1
            status = solver.Solve(self.m)
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                raise RuntimeError(f"tier {tier}: {solver.StatusName(status)}")
            proven &= status == cp_model.OPTIMAL
            # The best solution found is fixed for the next tier; a fleet where a step was not
            # proven optimal is flagged (its gap is a lower bound of the true gap).
            value = int(round(solver.ObjectiveValue()))
            best[tier] = value
            self.m.Add(self.tier_sum(tier) >= value)
        return best, proven

    def reachable(self, placed, seconds):
        """Per tier, the most replicas the tier can have while every higher tier keeps our
        plan's placements exactly (what a method that never moves a higher-priority replica
        could reach from our plan)."""
        out, proven = {}, True
        deps = self.p["deployments"]
        for tier in self.tiers():
            m = self.m.Clone()
            for di, (xs, d) in enumerate(zip(self.x, deps)):
                if d["priority"] > tier:
                    want = defaultdict(int)
                    for pool, rank, n in placed[di]:
                        want[(pool, rank)] += n
                    for k, o in enumerate(d["options"]):
                        m.Add(xs[k] == want.get((o["pool"], o["rank"]), 0))
            m.Maximize(self.tier_sum(tier))
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = seconds
            solver.parameters.num_workers = 2
            solver.parameters.random_seed = 1
            status = solver.Solve(m)
            proven &= status == cp_model.OPTIMAL
            out[tier] = int(round(solver.ObjectiveValue())) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else 0
        return out, proven

    def accepts(self, placed):
        """Whether our plan is a solution of the model (the model is not stricter than ours)."""
        check = self.m.Clone()
        for di, (xs, d) in enumerate(zip(self.x, self.p["deployments"])):
            want = defaultdict(int)
            for pool, rank, n in placed[di]:
                want[(pool, rank)] += n
            for k, o in enumerate(d["options"]):
                check.Add(xs[k] == want.pop((o["pool"], o["rank"]), 0))
            if any(want.values()):
                return False
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = 10
        return solver.Solve(check) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input", help="JSON lines from the quality_export example ('-' for stdin)")
    ap.add_argument("--seconds", type=float, default=20.0, help="CP-SAT time per tier")
    ap.add_argument("--json", help="write per-fleet results here")
    args = ap.parse_args()
    lines = sys.stdin if args.input == "-" else open(args.input)
    rows = []
    for line in lines:
        doc = json.loads(line)
        p, placed = doc["problem"], doc["placed"]
        model = Model(p)
        # before optimum() fixes the tiers; judged in the order the plan solved its tiers in (the
        # optimum keeps the problem's order)
        order = doc.get("solveOrder")
        traded = order is not None and order != list(range(len(p["deployments"])))
        accepted = (Model(p, order) if traded else model).accepts(placed)
        reach, reach_proven = model.reachable(placed, args.seconds)
        best, proven = model.optimum(args.seconds)
        ours = defaultdict(int)
        for d, pl in zip(p["deployments"], placed):
            ours[d["priority"]] += sum(n for _, _, n in pl)
        total_ours, total_best = sum(ours.values()), sum(best.values())
        # The highest tier where the plan and the optimum differ: a loss there is a tier loss.
        lost = next((t for t in model.tiers() if ours[t] != best[t]), None)
        tier_loss = lost is not None and ours[lost] < best[lost]
        gap = 0.0 if total_best == 0 else (total_best - total_ours) / total_best
        # Against what is reachable without moving a higher tier: per-tier shortfalls.
        short = {t: reach[t] - ours[t] for t in model.tiers() if reach[t] > ours[t]}
        total_reach = sum(max(reach[t], ours[t]) for t in model.tiers())
        reach_gap = 0.0 if total_reach == 0 else sum(short.values()) / total_reach
        rows.append(
            {
                "spec": doc["spec"],
                "topTier": model.tiers()[0] if model.tiers() else None,
                "ours": total_ours,
                "optimum": total_best,
                "gap": gap,
                "proven": proven and reach_proven,
                "reachGap": reach_gap,
                "reachShort": {str(t): n for t, n in short.items()},
                "tierLoss": tier_loss,
                "lostTier": lost if tier_loss else None,
                # The fleet's top tier short of the optimum's.
                "topLoss": bool(model.tiers()) and ours[model.tiers()[0]] < best[model.tiers()[0]],
                # A tier short while a lower one has more than the optimum gives it.
                "inversion": tier_loss and any(ours[t] > best[t] for t in model.tiers() if t < lost),
                "accepted": accepted,
                "solveMicros": doc.get("solveMicros"),
            }
        )
        r = rows[-1]
        print(
            f"{doc['spec']}: ours {total_ours} optimum {total_best} gap {gap:.1%}"
            f"{'' if proven else ' (bound)'}{' TIER LOSS at ' + str(lost) if tier_loss else ''}"
            f"{'' if r['accepted'] else ' PLAN NOT ACCEPTED BY THE MODEL'}"
            f"{' short of reachable ' + str(short) if short else ''}",
            file=sys.stderr,
        )
    n = len(rows)
    gaps = [r["gap"] for r in rows]
    summary = {
        "fleets": n,
        "meanGap": sum(gaps) / n if n else 0.0,
        "worstGap": max(gaps) if n else 0.0,
        "optimal": sum(1 for r in rows if r["ours"] >= r["optimum"]),
        "proven": sum(1 for r in rows if r["proven"]),
        "tierLosses": sum(1 for r in rows if r["tierLoss"]),
        "topTierLosses": sum(1 for r in rows if r["topLoss"]),
        "inversions": sum(1 for r in rows if r["inversion"]),
        "meanReachGap": sum(r["reachGap"] for r in rows) / n if n else 0.0,
        "worstReachGap": max((r["reachGap"] for r in rows), default=0.0),
        "reachShortFleets": sum(1 for r in rows if r["reachShort"]),
        "topTierReachShortFleets": sum(
            1 for r in rows if r["reachShort"] and str(max(map(int, r["reachShort"]))) == str(r["topTier"])
        ),
        "planNotAccepted": sum(1 for r in rows if not r["accepted"]),
        "replicasOurs": sum(r["ours"] for r in rows),
        "replicasOptimum": sum(r["optimum"] for r in rows),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "fleets": rows}, f, indent=1)


if __name__ == "__main__":
    main()
