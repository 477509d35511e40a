#!/usr/bin/env python3
"""A discrete-event model of the multiplexing figure of
`cargo bench -p flotilla-benches --bench batch_multiplex`, for asking what
another routing or eviction rule would give without building it.

It models what the bench measures: 8 replicas with 3 model slots each, 32
models under a Zipf load, one 20 ms load at a time per replica (Ray's lock;
the victim is evicted when the load starts), a 1.5 ms handler (the bench's
1 ms sleep as tokio's timer runs it), `max_ongoing_requests` 16, and a request
that hits when its model was loaded on its replica when it was sent. The load
is 32 closed-loop callers, or an open-loop offered rate. The first 2 s are a
warm-up and are not counted.

Routing, as `flotilla-replica/src/router.rs` has it: a replica with room that
holds (or is loading) the model, by power of two choices; else, among the
replicas with room holding the fewest models,
- `ray`: one at random (Ray's rule);
- `heat`: the one whose next victim has the lowest heat (the default router:
  `ln sum e^(t/4096)` over the model's uses `t` on the deployment's use clock);
- `queue`: as `heat`, but a replica that is loading may take one more load,
  judged by the heat of the model it is loading (an experiment, not built);
- `partition`: an experiment, not built: the router ranks models by its own
  heat (of the requests it routes) and calls the `PARTITION` hottest "hot".
  A load goes to a replica whose next victim is not hot; a hot model's load
  to the one with the fewest loads under way, a cold model's to the one
  holding the most cold models (so the tail gathers on a few replicas and
  the hot models stay where they are);
- `oracle`: not a router but a reference point with knowledge no router
  has (not a proof of a bound): the `PINNED` most popular models are
  placed once, by their true shares (each on the replica with the least
  share so far), and a model outside them goes to a replica with a slot they
  leave, one with a free load lane first, then the coldest victim.
Eviction inside a replica: `lru` (Ray's, the issue's, Flotilla's), `lfu`
(the lowest heat; an experiment, not built) or `protect` (the least recently
used of the models `oracle` did not pin: a pinned model is never evicted).

It is a model, not the code: it reproduced the bench within about 0.01 of hit
rate (session 9 of BENCHMARKS.md). Deterministic for a given seed.

    python3 benches/models/multiplex.py            # the table of BENCHMARKS.md
"""

import heapq
import math
import random

REPLICAS, SLOTS, MODELS, CALLERS = 8, 3, 32, 32
LOAD_MS, HANDLER_MS = 20.0, 1.5
MAX_ONGOING = 16
HEAT_WINDOW = 4096.0
PINNED = 20
PARTITION = 18


def zipf_cdf(n, s):
    weights = [1 / (k + 1) ** s for k in range(n)]
    total, acc, cdf = sum(weights), 0.0, []
    for w in weights:
        acc += w / total
        cdf.append(acc)
    return cdf


class Replica:
    def __init__(self, index):
        self.index = index
        self.loaded = []  # [model, heat], least recently used first
        self.loading = []  # models waiting for the lane; the first is loading
        self.waiters = {}  # model -> callers waiting for its load
        self.in_flight = 0
        self.loading_heat = 0.0  # the use clock's heat when its load began

    def holds(self, model):
        return model in self.loading or any(m == model for m, _ in self.loaded)

    def count(self):
        return len(self.loaded) + len(self.loading)

    def has_room(self):
        return self.in_flight < MAX_ONGOING


class Model:
    def __init__(self, routing, eviction, zipf_s, rate_per_s, seed):
        self.routing, self.eviction, self.rate = routing, eviction, rate_per_s
        self.rng = random.Random(seed)
        self.cdf = zipf_cdf(MODELS, zipf_s)
        self.replicas = [Replica(i) for i in range(REPLICAS)]
        self.events, self.seq, self.clock = [], 0, 0
        self.hits = self.misses = self.loads = 0
        self.pinned = {}  # model -> replica, for `oracle`
        self.heat = {}  # model -> the router's heat, for `partition`
        self.latencies = []  # ms from send to answer, of counted requests
        self.churn = []  # replicas with a slot the pinned models leave
        if routing == "oracle":
            self.pin()

    def pin(self):
        """Place the PINNED most popular models once, heaviest first, each on
        the replica with the least share so far that has a free slot."""
        share = [self.cdf[0]] + [b - a for a, b in zip(self.cdf, self.cdf[1:])]
        held = [0.0] * REPLICAS
        for model in range(PINNED):
            free = [r for r in self.replicas if len(r.loaded) < SLOTS]
            r = min(free, key=lambda r: held[r.index])
            held[r.index] += share[model]
            r.loaded.append([model, 0.0])
            self.pinned[model] = r
        self.churn = [r for r in self.replicas if len(r.loaded) < SLOTS]

    def at(self, t, *event):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq) + event)

    def use(self, heat):
        """One tick of the use clock: a new use's heat, added to `heat`."""
        self.clock += 1
        tick = self.clock / HEAT_WINDOW
        if heat is None:
            return tick
        hi, lo = max(heat, tick), min(heat, tick)
        return hi + math.log1p(math.exp(lo - hi))

    def victim(self, r):
        if not r.loaded:
            return None
        if self.eviction == "lru":
            return r.loaded[0]
        if self.eviction == "protect":
            return next((e for e in r.loaded if e[0] not in self.pinned), r.loaded[0])
        return min(r.loaded, key=lambda e: e[1])

    def victim_heat(self, r):
        v = self.victim(r)
        return v[1] if v else -math.inf

    def p2c(self, candidates):
        if len(candidates) == 1:
            return candidates[0]
        a, b = self.rng.sample(candidates, 2)
        return b if b.in_flight < a.in_flight else a

    def rotated(self, candidates):
        k = self.rng.randrange(len(candidates))
        return candidates[k:] + candidates[:k]

    def choose(self, model):
        holders = [r for r in self.replicas if r.has_room() and r.holds(model)]
        if holders:
            return self.p2c(holders)
        room = [r for r in self.replicas if r.has_room()]
        fewest = min(r.count() for r in room)
        eligible = [r for r in room if r.count() == fewest]
        if self.routing == "ray":
            return self.rng.choice(eligible)
        if self.routing == "oracle":
            churn = [r for r in self.churn if r.has_room()] or room
            return min(
                self.rotated(churn), key=lambda r: (len(r.loading), self.victim_heat(r))
            )
        if self.routing == "partition":
            return self.partitioned(model, room)
        if self.routing == "heat":
            return min(self.rotated(eligible), key=lambda r: (self.victim_heat(r), r.in_flight))
        # "queue": a loading replica may take one more load (while none
        # qualifies, every replica with room does).
        eligible = [r for r in room if r.count() <= SLOTS + (1 if r.loading else 0)] or room

        def next_victim(r):
            v = self.victim_heat(r)
            return min(v, r.loading_heat) if r.loading else v

        return min(
            self.rotated(eligible), key=lambda r: (next_victim(r), len(r.loading), r.in_flight)
        )

    def partitioned(self, model, room):
        ranked = sorted(self.heat, key=lambda k: -self.heat[k])
        hot = set(ranked[:PARTITION])

        def victim_hot(r):
            v = self.victim(r)
            return r.count() >= SLOTS and v is not None and v[0] in hot

        def cold(r):
            held = [m for m, _ in r.loaded] + r.loading
            return SLOTS - r.count() + sum(1 for m in held if m not in hot)

        if model in hot:
            key = lambda r: (victim_hot(r), len(r.loading), self.victim_heat(r))  # noqa: E731
        else:
            key = lambda r: (victim_hot(r), -cold(r), len(r.loading), self.victim_heat(r))  # noqa: E731
        return min(self.rotated(room), key=key)

    def send(self, t, caller, counted):
        u = self.rng.random()
        model = next((k for k, c in enumerate(self.cdf) if c >= u), MODELS - 1)
        if self.routing == "partition":
            self.heat[model] = self.use(self.heat.get(model))
        r = self.choose(model)
        caller = (caller, t, counted)  # the request: who sent it, when, counted
        r.in_flight += 1
        for entry in r.loaded:
            if entry[0] == model:
                entry[1] = self.use(entry[1])
                r.loaded.remove(entry)
                r.loaded.append(entry)
                self.hits += counted
                self.at(t + HANDLER_MS, "done", r.index, caller)
                return
        self.misses += counted
        r.waiters.setdefault(model, []).append(caller)
        if model not in r.loading:
            r.loading.append(model)
            self.loads += counted
            if len(r.loading) == 1:
                self.start_load(t, r)

    def start_load(self, t, r):
        r.loading_heat = self.clock / HEAT_WINDOW
        if len(r.loaded) >= SLOTS:
            r.loaded.remove(self.victim(r))
        self.at(t + LOAD_MS, "loaded", r.index, r.loading[0])

    def finish_load(self, t, r, model):
        r.loading.remove(model)
        r.loaded.append([model, self.use(None)])
        for caller in r.waiters.pop(model, []):
            self.at(t + HANDLER_MS, "done", r.index, caller)
        if r.loading:
            self.start_load(t, r)

    def run(self, until_ms=20_000.0, warmup_ms=2_000.0):
        open_loop = self.rate is not None
        for caller in range(1 if open_loop else CALLERS):
            self.at(self.rng.random(), "send", None, caller)
        while self.events:
            t, _, kind, index, arg = heapq.heappop(self.events)
            if t > until_ms:
                break
            if kind == "send":
                self.send(t, arg, t >= warmup_ms)
                if open_loop:
                    self.at(t + self.rng.expovariate(self.rate / 1000.0), "send", None, 0)
            elif kind == "done":
                self.replicas[index].in_flight -= 1
                caller, sent, counted = arg
                if counted:
                    self.latencies.append(t - sent)
                if not open_loop:
                    self.at(t, "send", None, caller)
            else:
                self.finish_load(t, self.replicas[index], arg)
        n = self.hits + self.misses
        return self.hits / n, n / (until_ms - warmup_ms) * 1000.0, self.loads


LOADS = [None, 500, 1000, 2000]


def label(rate):
    return "closed, 32" if rate is None else f"open, {rate}/s"


def table(title, rules, split=None):
    """Print the hit rate (req/s) of each rule at each load, Zipf 1; with
    `split`, append how `heat/lru`'s misses divide to it."""
    print(title)
    print("load".ljust(14) + "".join(f"{r}/{e}".ljust(18) for r, e in rules))
    for rate in LOADS:
        cells = []
        for routing, eviction in rules:
            model = Model(routing, eviction, 1.0, rate, seed=1)
            hit, rps, loads = model.run()
            cells.append(f"{hit:.3f} ({rps:.0f})".ljust(18))
            if split is not None and (routing, eviction) == ("heat", "lru"):
                n = model.hits + model.misses
                split.append((label(rate), loads / n, (model.misses - loads) / n))
        print(label(rate).ljust(14) + "".join(cells))
    print()


def main():
    split = []
    rules = [("ray", "lru"), ("heat", "lru"), ("heat", "lfu"), ("queue", "lru")]
    table("Zipf 1; hit rate (req/s) by load and rule", rules, split)
    # A reference point: what a router that knew every model's share reaches,
    # placing them once, with the replicas' LRU eviction and with its pinned
    # models never evicted.
    table(
        f"Zipf 1; the oracle placement of the {PINNED} most popular models",
        [("oracle", "protect"), ("oracle", "lru")],
    )
    # What a higher hit rate costs: `partition` against the default, with
    # the loads each request began and the latency callers see.
    print("Zipf 1; hit rate, loads per request, latency p50 / p99 (ms)")
    print("load".ljust(14) + "".join(r.ljust(36) for r in ["heat/lru", f"partition/lru ({PARTITION} hot)"]))
    for rate in LOADS:
        cells = []
        for routing in ["heat", "partition"]:
            model = Model(routing, "lru", 1.0, rate, seed=1)
            hit, _, loads = model.run()
            lat = sorted(model.latencies)
            p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
            n = model.hits + model.misses
            cells.append(f"{hit:.3f} {loads / n:.3f} {p50:.1f} / {p99:.1f}".ljust(36))
        print(label(rate).ljust(14) + "".join(cells))
    print()
    # A miss either begins a load or waits for one in progress (of the same
    # model on the same replica): how the default's misses divide.
    print("heat/lru misses per request: loads begun, waits for a load in progress")
    for row, began, joined in split:
        print(row.ljust(14) + f"{began:.3f}".ljust(18) + f"{joined:.3f}")


if __name__ == "__main__":
    main()
