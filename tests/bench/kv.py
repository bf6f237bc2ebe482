"""KV pressure: goodput of a simulated backend whose KV cache is too small, against one
whose KV cache never runs out, under closed-loop load at rising concurrency.

    python tests/bench/kv.py                       # concurrency 4 8 16 32 64, a few seconds
    python tests/bench/kv.py --concurrency 8,32 --seconds 600 --kv-blocks 2048

No server and no wall clock: each run drives the simulator's step model
(``gateway.sim.batch.Batch``, the very model ``obleth mock-backend`` runs) on a virtual
clock, so a run of minutes of simulated time takes a second and gives the same numbers on
every machine. ``--concurrency`` clients each send a request, wait for its last token and
send the next one at once (closed loop). Each client draws its requests from its own
seeded generator, so the small and the large cache serve exactly the same requests.

Requests have distinct prompts of 256-1 024 tokens and ask for 128-512 output tokens; the
timing is the simulator's default (a 10 ms step, 0.2 ms per sequence, 0.2 ms per prefill
token) with 256 batch slots, so the KV cache, not ``max_num_seqs``, is what limits the
batch. The small cache (``--kv-blocks``, 1 024 blocks of 16 tokens by default) holds the
prompts of about 25 requests but the whole sequences of only about 17: admitted on their
prompt, requests outgrow it as they decode, and the newest is preempted and recomputed
later (prompt and output so far), which stalls the whole batch while it prefills. That
is throughput lost to preemption, as on a GPU whose server admits more than its KV cache
holds. The baseline's cache (1 000 000 blocks) never preempts.

Printed per concurrency, over the measured window (after ``--warmup`` seconds): completed
requests per second (goodput), output tokens per second, preemptions, mean time to first
token, for the small cache and the baseline, and the small cache's goodput and token rate
as a ratio of the baseline's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the gateway package of this checkout

from gateway.sim.batch import Batch  # noqa: E402
from gateway.sim.config import SimConfig  # noqa: E402
from gateway.sim.tokens import TokenizedPrompt, tokenize  # noqa: E402

PROMPT_TOKENS = (256, 1024)
OUTPUT_TOKENS = (128, 512)
MAX_NUM_SEQS = 256
BASELINE_KV_BLOCKS = 1_000_000


@dataclass(frozen=True, slots=True)
class Outcome:
    """One closed-loop run, counted over the measured window."""

    seconds: float
    completed: int
    output_tokens: int
    preemptions: int
    ttft_s: list[float]

    @property
    def goodput(self) -> float:
        return self.completed / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def mean_ttft_ms(self) -> float:
        return 1000 * statistics.fmean(self.ttft_s) if self.ttft_s else float("nan")


def prompt(config: SimConfig, request: int, tokens: int) -> TokenizedPrompt:
    """A prompt of ``tokens`` tokens that shares no block with any other request."""
    head = f"request {request:08d} "
    text = head + "x" * (tokens * config.chars_per_token - len(head))
    return tokenize(
        text, chars_per_token=config.chars_per_token, block_size_tokens=config.block_size_tokens
    )


def run(config: SimConfig, concurrency: int, warmup: float, seconds: float, seed: int) -> Outcome:
    """Closed-loop load of ``concurrency`` clients on one simulated backend."""
    batch = Batch(config)
    clients = [random.Random(f"{seed}:{client}") for client in range(concurrency)]
    owner: dict[int, int] = {}
    sent = 0

    def send(client: int, now: float) -> None:
        nonlocal sent
        rng = clients[client]
        tokens, max_tokens = rng.randint(*PROMPT_TOKENS), rng.randint(*OUTPUT_TOKENS)
        sequence = batch.add(prompt(config, sent, tokens), max_tokens, now)
        owner[sequence.seq_id] = client
        sent += 1

    for client in range(concurrency):
        send(client, 0.0)
    now, end = 0.0, warmup + seconds
    completed = output_tokens = preemptions = 0
    ttft_s: list[float] = []
    while now < end:
        plan = batch.begin_step(now)
        now += plan.duration_s
        result = batch.end_step(now)
        measured = now > warmup
        if measured:
            output_tokens += len(result.emitted)
            preemptions += len(plan.preempted)
            ttft_s += [now - s.arrived_at for s in result.emitted if s.generated == 1]
            completed += len(result.finished)
        for sequence in result.finished:
            send(owner.pop(sequence.seq_id), now)
    return Outcome(now - warmup, completed, output_tokens, preemptions, ttft_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--concurrency", default="4,8,16,32,64", help="comma-separated clients")
    parser.add_argument("--kv-blocks", type=int, default=1024, help="the small KV cache")
    parser.add_argument("--seconds", type=float, default=300.0, help="measured virtual time")
    parser.add_argument("--warmup", type=float, default=30.0, help="virtual time not measured")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    small = SimConfig(max_num_seqs=MAX_NUM_SEQS, kv_cache_blocks=args.kv_blocks)
    large = SimConfig(max_num_seqs=MAX_NUM_SEQS, kv_cache_blocks=BASELINE_KV_BLOCKS)
    print(
        f"closed loop, {args.seconds:g} s measured after {args.warmup:g} s (virtual clock); "
        f"prompts {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens, "
        f"outputs {OUTPUT_TOKENS[0]}-{OUTPUT_TOKENS[1]} tokens; "
        f"small KV {args.kv_blocks} blocks x {small.block_size_tokens} tokens, "
        f"baseline {BASELINE_KV_BLOCKS} blocks"
    )
    header = (
        f"{'clients':>7} | {'req/s':>6} {'tok/s':>7} {'preempt':>7} {'ttft ms':>8} | "
        f"{'base req/s':>10} {'base tok/s':>10} {'base ttft':>9} | {'req/s x':>7} {'tok/s x':>7}"
    )
    print(header)
    print("-" * len(header))
    for level in levels:
        kv = run(small, level, args.warmup, args.seconds, args.seed)
        base = run(large, level, args.warmup, args.seconds, args.seed)
        print(
            f"{level:>7} | {kv.goodput:>6.2f} {kv.tokens_per_s:>7.0f} {kv.preemptions:>7} "
            f"{kv.mean_ttft_ms:>8.0f} | {base.goodput:>10.2f} {base.tokens_per_s:>10.0f} "
            f"{base.mean_ttft_ms:>9.0f} | {kv.goodput / base.goodput:>7.2f} "
            f"{kv.tokens_per_s / base.tokens_per_s:>7.2f}"
        )


if __name__ == "__main__":
    main()
