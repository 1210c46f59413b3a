"""Iteration-level scheduling: decodes first, chunked prefill under the budget, preemption, aging.

`Sim` drives a scheduler as the engine does and stands in for the model with a store of
token ids per KV slot: every chunk writes its tokens through the block table, and every
sampling chunk reads the whole history back through it. A block table that points at the
wrong block, a shared block written twice, or a reused prefix that holds other tokens makes
the history differ from the sequence's tokens, and the simulation fails.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.generate.blocks import BlockPool
from fleetserve_runtime.generate.scheduler import Policy, Scheduler, SchedulerLimits, StepPlan
from fleetserve_runtime.generate.sequence import Seq, SeqState


def next_token(history: list[int]) -> int:
    return (sum((pos + 1) * token for pos, token in enumerate(history)) * 31 + 7) % 50 + 10


@dataclass
class Sim:
    """A scheduler, a fake KV store, and each sequence's output budget."""

    scheduler: Scheduler
    max_new: dict[int, int] = field(default_factory=dict)
    slots: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    plans: list[StepPlan] = field(default_factory=list)
    finished: list[Seq] = field(default_factory=list)

    @classmethod
    def make(
        cls,
        *,
        num_blocks: int = 64,
        block_size: int = 4,
        max_running: int = 8,
        max_step_tokens: int = 16,
        prefix_caching: bool = True,
        aging_s: float = 0.0,
        policy: Policy = "continuous",
    ) -> Sim:
        """A scheduler over a fresh pool."""
        pool = BlockPool(num_blocks, block_size, prefix_caching=prefix_caching)
        limits = SchedulerLimits(max_running, max_step_tokens, aging_s, policy)
        return cls(Scheduler(pool, limits))

    def add(
        self,
        seq_id: int,
        prompt: list[int],
        max_new: int,
        *,
        priority: Priority = Priority.NORMAL,
        at: float = 0.0,
    ) -> Seq:
        """Queue a sequence that generates `max_new` tokens."""
        seq = Seq(seq_id, list(prompt), len(prompt), priority=priority, arrived_at=at)
        self.max_new[seq_id] = max_new
        self.scheduler.add(seq)
        return seq

    def step(self) -> StepPlan:
        """Schedule, "run" and commit one step, checking the invariants."""
        scheduler, pool = self.scheduler, self.scheduler.pool
        plan = scheduler.schedule()
        self.plans.append(plan)
        assert plan.num_tokens <= scheduler.limits.max_step_tokens
        assert scheduler.num_running <= scheduler.limits.max_running_sequences
        tokens: list[int | None] = []
        for chunk in plan.chunks:
            seq, bs = chunk.seq, pool.block_size
            assert chunk.length > 0
            assert chunk.start == seq.num_computed
            for offset, token in enumerate(chunk.token_ids):
                pos = chunk.start + offset
                block = seq.block_table[pos // bs]
                # A block someone else also holds is a shared, full, computed prefix block.
                assert pool.refs(block) == 1, "a step writes into a shared block"
                self.slots[(block, pos % bs)] = (pos, token)
            if not chunk.samples:
                tokens.append(None)
                continue
            end = chunk.start + chunk.length
            history = [self.slots[(seq.block_table[p // bs], p % bs)] for p in range(end)]
            assert history == list(enumerate(seq.tokens[:end])), "KV history differs"
            tokens.append(next_token(seq.tokens))
        scheduler.commit(plan, tokens)
        for chunk in plan.chunks:
            seq = chunk.seq
            if len(seq.tokens) - seq.prompt_len >= self.max_new[seq.seq_id]:
                scheduler.finish(seq)
                self.finished.append(seq)
        self.check_references()
        return plan

    def check_references(self) -> None:
        """Every block's count is the number of running tables that hold it."""
        pool = self.scheduler.pool
        held: dict[int, int] = {}
        for seq in self.scheduler.running():
            for block in seq.block_table:
                held[block] = held.get(block, 0) + 1
        for block in range(pool.num_blocks):
            assert pool.refs(block) == held.get(block, 0)

    def run(self, max_steps: int = 10_000) -> None:
        """Step until nothing runs or waits."""
        for _ in range(max_steps):
            if not (self.scheduler.num_running or self.scheduler.num_waiting):
                return
            self.step()
        pytest.fail("the simulation did not finish")


def reference_output(prompt: list[int], max_new: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_new):
        tokens.append(next_token(tokens))
    return tokens


def test_running_decodes_come_first_and_a_long_prompt_is_chunked() -> None:
    """With streams decoding, a long prompt gets only what the budget leaves, over many steps.

    The prompt outranks the streams (HIGH priority), and still comes after their decodes.
    """
    sim = Sim.make(max_step_tokens=8, block_size=4)
    for n in range(3):
        sim.add(n, [n + 1, 2, 3], 20)
    sim.step()
    sim.step()
    long = sim.add(9, list(range(1, 41)), 2, priority=Priority.HIGH)
    prefill_steps = 0
    while long.num_computed < 40:
        plan = sim.step()
        decodes = [c for c in plan.chunks if c.seq is not long]
        assert len(decodes) == 3
        assert all(c.length == 1 for c in decodes)
        mine = [c for c in plan.chunks if c.seq is long]
        assert len(mine) == 1
        assert mine[0].length <= 5
        prefill_steps += 1
    assert prefill_steps == 8
    sim.run()
    assert long.tokens == reference_output(list(range(1, 41)), 2)


def test_every_sequence_finishes_with_the_output_it_would_get_alone() -> None:
    """Mixed lengths under a small budget: every admitted sequence finishes, outputs correct."""
    rng = random.Random(7)
    sim = Sim.make(num_blocks=200, max_step_tokens=24, max_running=5)
    prompts = {n: [rng.randint(1, 60) for _ in range(rng.randint(1, 30))] for n in range(20)}
    news = {n: rng.randint(1, 15) for n in prompts}
    for n, prompt in prompts.items():
        sim.add(n, prompt, news[n])
    sim.run()
    assert len(sim.finished) == 20
    for seq in sim.finished:
        assert seq.tokens == reference_output(prompts[seq.seq_id], news[seq.seq_id])
    assert sim.scheduler.pool.free_blocks == 200


def random_workload(seed: int, *, prefix_caching: bool) -> Sim:
    """Tiny pools, shared prefixes, priorities, arrivals over time; runs it to the end."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    sim = Sim.make(
        num_blocks=rng.randint(7, 14) * 4 // block_size,
        block_size=block_size,
        max_running=rng.randint(1, 6),
        max_step_tokens=rng.randint(6, 20),
        prefix_caching=prefix_caching,
        aging_s=rng.choice([0.0, 1.0]),
    )
    shared = [rng.randint(1, 60) for _ in range(8)]
    expected: dict[int, list[int]] = {}
    pending = list(range(25))
    step = 0
    while pending or sim.scheduler.num_running or sim.scheduler.num_waiting:
        while pending and rng.random() < 0.4:
            n = pending.pop(0)
            tail = [rng.randint(1, 60) for _ in range(rng.randint(1, 6))]
            prompt = (shared if rng.random() < 0.6 else []) + tail
            max_new = rng.randint(1, 12)
            expected[n] = reference_output(prompt, max_new)
            sim.add(n, prompt, max_new, priority=rng.choice(list(Priority)), at=step * 0.1)
        if sim.scheduler.num_running or sim.scheduler.num_waiting:
            sim.step()
        step += 1
        assert step < 5000
    assert sorted(seq.seq_id for seq in sim.finished) == list(range(25))
    for seq in sim.finished:
        assert seq.tokens == expected[seq.seq_id]
        assert seq.state is SeqState.FINISHED
    return sim


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_random_workloads_never_leak_blocks_or_lose_sequences(
    seed: int, prefix_caching: bool
) -> None:
    """Property: every sequence finishes with its reference output, every count returns to 0.

    The token budget and the reference counts are checked after every step in `Sim.step`.
    """
    sim = random_workload(seed, prefix_caching=prefix_caching)
    pool = sim.scheduler.pool
    assert pool.free_blocks == pool.num_blocks
    assert all(pool.refs(block) == 0 for block in range(pool.num_blocks))


def test_the_random_workloads_preempt_and_hit_the_prefix_cache() -> None:
    """The property test above does exercise preemption and prefix reuse."""
    sims = [random_workload(seed, prefix_caching=True) for seed in range(8)]
    assert sum(sim.scheduler.preemptions for sim in sims) > 0
    assert sum(sim.scheduler.pool.hit_tokens for sim in sims) > 0


def test_out_of_blocks_preempts_the_lowest_priority_newest_sequence() -> None:
    """When a decode needs a block and none is free, the worst running sequence goes back."""
    sim = Sim.make(num_blocks=6, block_size=2, max_step_tokens=16, prefix_caching=False)
    high = sim.add(0, [1, 2, 3], 6, priority=Priority.HIGH, at=0.0)
    low_old = sim.add(1, [4, 5, 6], 6, priority=Priority.LOW, at=0.0)
    low_new = sim.add(2, [7, 8, 9], 6, priority=Priority.LOW, at=1.0)
    plan = sim.step()
    assert {c.seq.seq_id for c in plan.chunks} == {0, 1, 2}
    preempted: list[Seq] = []
    while not preempted:
        plan = sim.step()
        preempted = plan.preempted
    assert preempted == [low_new]
    assert not plan.admitted
    assert low_new.state is SeqState.WAITING
    assert low_new.block_table == []
    assert high.state is SeqState.RUNNING
    assert low_old.state is SeqState.RUNNING
    assert sim.scheduler.preemptions == 1
    sim.run()
    assert low_new.tokens == reference_output([7, 8, 9], 6)
    assert low_new.preemptions >= 1


def test_no_sequence_is_admitted_in_a_step_that_preempted() -> None:
    """Blocks freed by a preemption are not handed to a newcomer in the same step."""
    sim = Sim.make(num_blocks=8, block_size=2, max_step_tokens=32, prefix_caching=False)
    sim.add(0, [1, 2, 3, 4], 4, priority=Priority.HIGH, at=0.0)
    low = sim.add(1, list(range(1, 11)), 4, priority=Priority.LOW, at=1.0)
    sim.step()
    newcomer = sim.add(2, [5, 6, 7], 2, priority=Priority.NORMAL, at=2.0)
    plan = sim.step()
    assert plan.preempted == [low]
    assert plan.admitted == []
    assert sim.scheduler.pool.free_blocks >= 2
    assert sim.step().admitted == [newcomer]
    sim.run()
    assert low.tokens == reference_output(list(range(1, 11)), 4)


def test_a_sequence_that_is_itself_the_worst_preempts_itself() -> None:
    """The newest sequence needing a block is preempted rather than an older one."""
    sim = Sim.make(num_blocks=4, block_size=2, max_step_tokens=16, prefix_caching=False)
    old = sim.add(0, [1, 2, 3], 2, at=0.0)
    new = sim.add(1, [4, 5, 6, 7], 2, at=1.0)
    sim.step()
    plan = sim.step()
    assert plan.preempted == [new]
    assert [c.seq for c in plan.chunks] == [old]
    sim.run()
    assert new.tokens == reference_output([4, 5, 6, 7], 2)


def test_aging_lets_an_old_low_priority_request_in_first() -> None:
    """A LOW request that waited two aging periods outranks a NORMAL one that just arrived."""
    sim = Sim.make(max_running=1, aging_s=1.0)
    normal = sim.add(0, [1, 2], 1, priority=Priority.NORMAL, at=10.0)
    low = sim.add(1, [3, 4], 1, priority=Priority.LOW, at=7.5)
    plan = sim.step()
    assert plan.admitted == [low]
    sim.run()
    assert normal.state is SeqState.FINISHED


def test_without_aging_the_class_decides() -> None:
    """With aging off, a HIGH request that arrived last runs first."""
    sim = Sim.make(max_running=1, aging_s=0.0)
    sim.add(0, [1, 2], 1, priority=Priority.NORMAL, at=0.0)
    high = sim.add(1, [3, 4], 1, priority=Priority.HIGH, at=5.0)
    assert sim.step().admitted == [high]


def test_max_running_sequences_caps_the_batch() -> None:
    """No more than `max_running_sequences` run at once; the rest wait."""
    sim = Sim.make(max_running=2, max_step_tokens=64)
    for n in range(5):
        sim.add(n, [n + 1], 3)
    plan = sim.step()
    assert len(plan.chunks) == 2
    assert sim.scheduler.num_waiting == 3
    sim.run()
    assert len(sim.finished) == 5


def test_static_policy_runs_a_batch_to_completion_before_admitting() -> None:
    """Static batching: sequences arriving while a batch runs wait until it has finished."""
    sim = Sim.make(policy="static", max_running=4)
    sim.add(0, [1, 2], 5)
    sim.add(1, [3, 4], 2)
    sim.step()
    late = sim.add(2, [5, 6], 1)
    while sim.scheduler.num_running:
        plan = sim.step()
        assert all(c.seq is not late for c in plan.chunks)
    plan = sim.step()
    assert plan.admitted == [late]
    sim.run()
    assert late.tokens == reference_output([5, 6], 1)


def test_a_shared_prompt_prefix_is_reused_not_recomputed() -> None:
    """A second sequence with the same prompt starts from the first one's full blocks."""
    sim = Sim.make(block_size=4, max_step_tokens=64)
    prompt = list(range(1, 12))
    first = sim.add(0, prompt, 3)
    sim.run()
    second = sim.add(1, prompt + [40], 3)
    plan = sim.step()
    chunk = plan.chunks[0]
    assert chunk.seq is second
    assert chunk.start == 8
    assert second.cached_tokens == 8
    assert first.cached_tokens == 0
    pool = sim.scheduler.pool
    assert (pool.hit_tokens, pool.query_tokens) == (8, 11 + 12)
    sim.run()
    assert second.tokens == reference_output(prompt + [40], 3)


def test_the_last_prompt_token_is_always_computed() -> None:
    """A prompt made only of cached full blocks still computes its last token (for its logits)."""
    sim = Sim.make(block_size=4, max_step_tokens=64)
    prompt = list(range(1, 9))
    sim.add(0, prompt, 1)
    sim.run()
    again = sim.add(1, prompt, 1)
    plan = sim.step()
    assert (plan.chunks[0].start, plan.chunks[0].length) == (4, 4)
    assert again.cached_tokens == 4


def test_finishing_a_waiting_sequence_removes_it() -> None:
    """A cancelled waiting sequence leaves the queue and is never admitted."""
    sim = Sim.make(max_running=1)
    sim.add(0, [1], 2)
    gone = sim.add(1, [2], 2)
    sim.scheduler.finish(gone)
    assert sim.scheduler.num_waiting == 1
    sim.run()
    assert [seq.seq_id for seq in sim.finished] == [0]


def test_a_better_request_is_admitted_ahead_of_a_worse_prompt_in_prefill() -> None:
    """A long LOW prompt in chunked prefill leaves the next step's budget to a HIGH arrival.

    The HIGH request is admitted and prefilled in the first step after it arrives, and it
    finishes long before the LOW prompt's prefill does; the LOW prompt gets what is left.
    """
    sim = Sim.make(max_step_tokens=16, block_size=4, num_blocks=128)
    low = sim.add(0, list(range(1, 257)), 2, priority=Priority.LOW, at=0.0)
    sim.step()
    high = sim.add(1, [7, 8, 9, 10, 11], 5, priority=Priority.HIGH, at=1.0)
    plan = sim.step()
    assert [c.seq for c in plan.chunks] == [high, low]
    assert [c.length for c in plan.chunks] == [5, 11]
    steps = 1
    while high not in sim.finished:
        sim.step()
        steps += 1
    assert steps == 5
    assert low.num_computed < 256
    sim.run()
    assert high.tokens == reference_output([7, 8, 9, 10, 11], 5)
    assert low.tokens == reference_output(list(range(1, 257)), 2)


def test_a_worse_arrival_waits_for_the_better_prompt_in_prefill() -> None:
    """The converse: a LOW arrival takes only what a HIGH prompt's prefill leaves."""
    sim = Sim.make(max_step_tokens=16, block_size=4, num_blocks=128)
    high = sim.add(0, list(range(1, 257)), 2, priority=Priority.HIGH, at=0.0)
    sim.step()
    low = sim.add(1, [7, 8, 9, 10, 11], 5, priority=Priority.LOW, at=1.0)
    plan = sim.step()
    assert [c.seq for c in plan.chunks] == [high]
    assert low.state is SeqState.WAITING
