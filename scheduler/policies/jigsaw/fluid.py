"""Step 2 at light load, fluid sizing: while what the jobs ask for fits the cluster a
few times over, each job's size may be the one that maximises the sum over jobs of
(1 / T)^e, T its time to go at that size (a size other than what it holds charged its
move and a margin), e = `fluid_exponent`.

1 / T is the rate at which a job completes; their sum is how fast the jobs end were
the round's sizes to hold (a fluid view of mean JCT). An exponent of 1 races the
shortest job on every GPU that speeds it up (SRPT's answer, which under concave
speedups spends GPUs on its flat end); below 1 the sum is concave in each job's rate,
and GPUs spread over the jobs with the short ones wider, as heSRPT's shares do. The
view is myopic: it ignores when the jobs it leaves waiting start. So where its sizes run
other jobs than the shrink floor's, they are taken only when their completion sum
(`sizing.completion_sum`, the floors' yardstick) is no larger: spreading GPUs over many
jobs can run everyone slowly where queueing some ends them sooner. Where both run the
same jobs they are taken outright: the completion sum holds each size to the job's end,
which a round sized again every lease never does (it priced a long job lending GPUs to
a short one for minutes as if for hours). Under heavier load the floors decide alone.

Only adaptive jobs (`batch: {adaptive: true}`: a model with a batch per size) are sized
so: their goodput grows with GPUs far past what a fixed batch uses, which growth in
order overshoots; fixed-batch jobs, guests and jobs without a model keep the size
admission gave them (sized so, fixed-batch jobs moved within their noise, their
median JCT against Tiresias 1.2 points higher: `docs/results/elastic-sim.md`). Not
while a job is paced or starving, or jobs of several priorities wait (the sum knows
neither).

Cost, in the rounds it applies to (at most `fluid_load` x G GPUs asked for): for J
jobs of S sizes, O(J x S) numpy steps over the G GPUs where J x G is at most
`fluid_max_cells` (`shares.allocate`, exact: with 10 sizes a job, 7 ms for 160 jobs on
64 GPUs, 1 s for 3,000 jobs on 8,192, on a 2-core machine), else O(J x S) per step of a
bisection (`shares.relax`, the Lagrangian relaxation: 22 ms for those 3,000 jobs, the
same sizes there; on a few jobs it can miss the optimum by a few percent, where the
exact program is cheap).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.shares import allocate, relax
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.policies.jigsaw import resizing
from scheduler.policies.jigsaw.ordering import starving
from scheduler.policies.jigsaw.params import JigsawParams
from scheduler.policies.jigsaw.sizing import Sizing, completion_sum
from scheduler.policies.jigsaw.speeds import remaining_seconds_at


def applies(
    snapshot: ClusterSnapshot,
    jobs: list[JobView],
    capacity: int,
    paced: dict[int, int],
    params: JigsawParams,
) -> bool:
    """Whether this round may size jobs fluidly: what the jobs ask for is at most
    `fluid_load` times the GPUs, no job is paced or starving, one priority."""
    return (
        bool(jobs)
        and not paced
        and sum(job.workers for job in jobs) <= params.fluid_load * capacity
        and len({job.priority for job in jobs}) == 1
        and not any(starving(job, snapshot, params) for job in jobs)
    )


def sizes(
    ordered: list[JobView],
    admitted: dict[int, int],
    guests: set[int],
    capacity: int,
    rule: Sizing,
    params: JigsawParams,
) -> dict[int, int]:
    """The GPUs of each job admitted this round (absent: not admitted) out of
    `capacity`: the fluid sum's sizes where they admit the same jobs as `admitted` (the
    shrink floor's), or their completion sum is no larger than its; else `admitted`.
    Only adaptive jobs are sized; the others keep their size in `admitted`."""
    sized = [job for job in ordered if job.id not in guests and adaptive(job)]
    ids = {job.id for job in sized}
    fixed = {job_id: size for job_id, size in admitted.items() if job_id not in ids}
    left = capacity - sum(fixed.values())
    if left <= 0 or not sized:
        return admitted
    scores = [_scores(job, left, rule.per_node, params, rank) for rank, job in enumerate(sized)]
    counts = allocate(scores, left) if exact(len(sized), left, params) else relax(scores, left)
    fluid = {**fixed, **{job.id: n for job, n in zip(sized, counts, strict=True) if n}}
    if fluid.keys() == admitted.keys():
        return fluid  # the same jobs run, and the next round sizes them again
    # Those started now first, then the rest in order as GPUs free up.
    first = sorted(ordered, key=lambda job: job.id not in fluid)
    given = _Given(rule.per_node, rule.floor, rule.long_seconds, rule.long_floor, rule.paced, fluid)
    if completion_sum(first, given, capacity) <= completion_sum(ordered, rule, capacity):
        return fluid
    return admitted


def adaptive(job: JobView) -> bool:
    """Whether the sum sizes `job`: it has a model with a batch per size."""
    return job.model is not None and bool(job.model.batches)


def exact(jobs: int, gpus: int, params: JigsawParams) -> bool:
    """Whether the sum over `jobs` on `gpus` is solved exactly (else relaxed)."""
    return jobs * gpus <= params.fluid_max_cells


@dataclass(frozen=True)
class _Given(Sizing):
    """`Sizing` with the sizes of `given` where it has one."""

    given: dict[int, int] = field(default_factory=dict)

    def base(self, job: JobView) -> int:
        return self.given.get(job.id) or super().base(job)


def _scores(
    job: JobView, capacity: int, per_node: int, params: JigsawParams, rank: int
) -> dict[int, float]:
    """Each size's term of the sum, negated (`allocate` minimises); no GPUs scores
    nothing, a hair more the later the job is in the order, so ties go to the jobs
    ahead."""
    assert job.model is not None
    held = len(job.allocated_gpu_ids)
    scores = {0: -1e-9 * rank}
    for workers in job.model.sizes:
        if workers > capacity:
            break
        seconds = remaining_seconds_at(job, workers, per_node)
        if workers != held:
            seconds += resizing.cost(job) + params.fluid_margin_seconds
        scores[workers] = -((1.0 / max(seconds, 1e-9)) ** params.fluid_exponent)
    return scores
