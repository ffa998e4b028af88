"""Silent data corruption suspected (rules/train_sdc.py through the verdict): non-finite values
that one rank alone saw are said beside the program's own failure; the same on one GPU across
jobs is the verdict, gpu_hardware, and still never a drain."""
from __future__ import annotations

from slurm_attr.drain import candidates
from slurm_attr.model import Coverage, Evidence, Symptom
from slurm_attr.rules.jobwide import before_verdict
from slurm_attr.rules.pyrule import DictHistory
from slurm_attr.verdict import decide

RANKS = {str(r): f"n{r // 4 + 1}" for r in range(8)}  # 2 nodes x 4 ranks
JOB = {"job_id": "900", "nodes": ["n1", "n2"], "ranks": RANKS, "state": "FAILED", "exit_code": 1,
       "start_time": "2025-03-02T09:00:00", "end_time": "2025-03-02T10:00:00"}
# both nodes' kernel logs read whole and clean: an untrusted GPU claim they do not bear out is contradicted
CLEAN = [Coverage("kernel", "n1", "ok", ""), Coverage("kernel", "n2", "ok", ""), Coverage("stdout", None, "ok", "")]


def stop(rank, text="Loss is nan, stopping training"):
    return Symptom(id="train.nonfinite_loss", cause="user_error", role="root", priority=40, rank=rank,
                   summary=f"rank {rank}: training diverged", fields={"text": text},
                   evidence=[Evidence("stdout", "output/stdout", 100 + rank, f"[rank{rank}]: {text}")])


def inits():
    # NCCL's init line per rank: rank r on busId 0x18+r (cudaDev r % 4)
    return [Symptom(id="nccl.comm_rank", cause="unknown", role="context", rank=r, node=RANKS[str(r)],
                    fields={"nranks": 8, "cuda_dev": r % 4, "value": f"{0x18 + r:x}000"}) for r in range(8)]


def timeouts(ranks):
    return [Symptom(id="torch.watchdog_timeout", cause="comm_hang", role="cascade", priority=30, rank=r,
                    summary="watchdog timeout") for r in ranks]


def verdict(syms, history=None):
    return decide(JOB, before_verdict(syms, JOB, history), CLEAN)


def test_one_rank_alone_is_the_programs_failure_with_the_suspicion_beside_it():
    v = verdict([stop(6)] + inits() + timeouts([0, 1, 2, 3, 4, 5, 7]))
    assert v.cause == "user_error" and v.culprit_ranks == [6]
    sdc = [a for a in v.alternatives if a["cause"] == "gpu_hardware"]
    assert len(sdc) == 1 and "suspected silent data corruption" in sdc[0]["why"] and "n2 GPU 0000:1e:00" in sdc[0]["why"]
    kept = [s for s in v.symptoms if s.id == "train.sdc_one_rank"]
    assert [(s.node, s.gpu, s.rank, s.role) for s in kept] == [("n2", "0000:1e:00", 6, "context")]
    assert candidates(v) == []


def test_near_miss_every_rank_saw_it_is_divergence_with_no_suspicion():
    v = verdict([stop(r) for r in range(8)] + inits())
    assert v.cause == "user_error"
    assert not any(s.id.startswith("train.sdc") for s in v.symptoms)
    assert not any(a["cause"] == "gpu_hardware" for a in v.alternatives)


def test_near_miss_rank_zero_alone_is_where_programs_check_for_everyone():
    v = verdict([stop(0)] + inits() + timeouts(range(1, 8)))
    assert v.cause == "user_error" and not any(a["cause"] == "gpu_hardware" for a in v.alternatives)


def test_a_rank_local_value_on_rank_zero_counts():
    v = verdict([stop(0, "found NaN in local grad norm in backward pass before data-parallel communication collective")]
                + inits() + timeouts(range(1, 8)))
    assert any(a["cause"] == "gpu_hardware" and "n1 GPU 0000:18:00" in a["why"] for a in v.alternatives)


def test_the_same_gpu_again_across_jobs_is_the_verdict_and_never_a_drain():
    history = DictHistory({("n2", "0000:1e:00", "train.sdc_one_rank"): ["850"]})
    v = verdict([stop(6)] + inits() + timeouts([0, 1, 2, 3, 4, 5, 7]), history)
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n2"] and v.culprit_gpus == ["0000:1e:00"]
    assert "suspected silent data corruption" in v.summary and "2 jobs" in v.summary
    root = next(s for s in v.symptoms if s.id == "train.sdc_recurrent")
    assert root.role == "root" and root.status.claim == "unconfirmed"  # a clean kernel log does not contradict it
    assert any(e.source == "history" and "job 850" in e.text for e in root.evidence)
    assert candidates(v) == []  # the jobs' own word: never a drain


def test_near_miss_the_other_job_was_on_another_gpu_of_the_node():
    history = DictHistory({("n2", "0000:1d:00", "train.sdc_one_rank"): ["850"]})
    v = verdict([stop(6)] + inits() + timeouts([0, 1, 2, 3, 4, 5, 7]), history)
    assert v.cause == "user_error"


def test_near_miss_a_gpu_claim_the_kernel_would_log_is_still_contradicted_by_a_clean_log():
    ecc = Symptom(id="cuda.ecc_uncorrectable", cause="gpu_hardware", role="root", priority=60, rank=6,
                  summary="uncorrectable ECC", evidence=[Evidence("stdout", "output/stdout", 5, "CUDA error: uncorrectable ECC error")])
    v = verdict([ecc, stop(2)] + inits())
    assert next(s for s in v.symptoms if s.id == "cuda.ecc_uncorrectable").status.claim == "contradicted"
