"""Speed of ``obleth simulate``: simulated events per second of wall time.

    python tests/bench/simulate.py                          # 1 000 requests over 12 instances
    python tests/bench/simulate.py --instances 16 --requests 5000 --rate 250

The issue's target: 1 000 requests over 12 instances in under 5 s. Each configuration is
run twice in this process:

- **simulate**: the whole simulation, as the command runs it: Obleth's admission
  (``Scheduler``, fair queue, overflow policy), the ``Router`` with its scorers reading
  the instances' gauges every 0.25 s, and each instance's step model
  (``gateway.sim.batch.Batch``), on the virtual asyncio clock.
- **model only** (the baseline): the same requests handed round-robin to the same
  number of ``Batch`` objects, stepped by a plain heap of step ends, with no gateway,
  no router and no asyncio. It is the least a simulation with this step model can cost.

Events are instance steps, request arrivals, completions and readings of the instances
(one per instance per scrape); the baseline counts its steps, arrivals and completions.
Printed: wall seconds, simulated seconds, events, events per second, and the ratio of
the whole simulation's events per second to the model's.
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the gateway package of this checkout

from gateway.sim.batch import Batch  # noqa: E402
from gateway.sim.tokens import tokenize  # noqa: E402
from gateway.simulate.profiles import named  # noqa: E402
from gateway.simulate.run import Plan, simulate  # noqa: E402
from gateway.simulate.workload import CHARS_PER_TOKEN, Tokens, Workload  # noqa: E402


def whole(plan: Plan) -> tuple[float, float, int]:
    """Wall seconds, simulated seconds and events of the whole simulation."""
    started = time.perf_counter()
    result = simulate(plan)
    wall = time.perf_counter() - started
    steps = result.steps
    scrapes = int(result.end_s / plan.scrape_interval_s) + 1
    events = steps + 2 * len(result.outcomes) + scrapes * plan.num_instances
    return wall, result.end_s, events


def model_only(plan: Plan) -> tuple[float, float, int]:
    """The same requests on bare `Batch` objects, round-robin, stepped by a heap."""
    config = plan.profile.config
    requests = plan.workload.requests(plan.seed)
    started = time.perf_counter()
    batches = [Batch(config) for _ in range(plan.num_instances)]
    stepping = [False] * plan.num_instances
    # (time, order, kind, instance, request index); kinds: 0 arrival, 1 step end
    events: list[tuple[float, int, int, int, int]] = []
    order = 0
    for request in requests:
        events.append((request.arrival_s, order, 0, order % plan.num_instances, request.index))
        order += 1
    heapq.heapify(events)
    count = finished = 0
    now = 0.0
    while events:
        now, _, kind, n, index = heapq.heappop(events)
        count += 1
        batch = batches[n]
        if kind == 0:
            request = requests[index]
            prompt = tokenize(
                request.prompt,
                chars_per_token=CHARS_PER_TOKEN,
                block_size_tokens=config.block_size_tokens,
            )
            batch.add(prompt, request.output_tokens, now)
            if stepping[n]:
                continue
        else:
            finished += len(batch.end_step(now).finished)
        if batch.idle:
            stepping[n] = False
            continue
        stepping[n] = True
        plan_ = batch.begin_step(now)
        order += 1
        heapq.heappush(events, (now + plan_.duration_s, order, 1, n, -1))
    assert finished == len(requests)
    return time.perf_counter() - started, now, count + finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen/qwen3-14b")
    parser.add_argument("--instances", type=int, default=12)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--tokens", type=int, default=512, help="input and output tokens")
    args = parser.parse_args()
    tokens = Tokens("fixed", args.tokens)
    plan = Plan(
        profile=named(args.model),
        workload=Workload(args.rate, args.requests, tokens, tokens),
        num_instances=args.instances,
        seed=42,
        scrape_interval_s=0.25,
    )
    print(
        f"{args.model}: {args.requests} requests at {args.rate:g} req/s over "
        f"{args.instances} instances, {args.tokens}/{args.tokens} tokens"
    )
    print(f"{'run':<12}{'wall s':>9}{'simulated s':>13}{'events':>9}{'events/s':>11}")
    rows = {}
    for name, run in (("model only", model_only), ("simulate", whole)):
        wall, simulated, events = run(plan)
        rows[name] = events / wall
        print(f"{name:<12}{wall:>9.2f}{simulated:>13.2f}{events:>9}{events / wall:>11.0f}")
    print(f"simulate / model only, events per second: {rows['simulate'] / rows['model only']:.2f}")


if __name__ == "__main__":
    main()
