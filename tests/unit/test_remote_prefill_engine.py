"""The engine's side of the two-box mode over a fake runner: a prompt parked while its KV is
imported chunk by chunk, the other streams decoding meanwhile, the last prompt token computed
here, and every failure resuming local prefill from the last imported chunk."""

import numpy as np

from app.engine.engine import EngineConfig, LLMEngine
from app.engine.remote_prefill import RemoteJob, RemoteOutcome
from app.engine.request import RequestStatus
from app.engine.scheduler import SchedulerConfig
from tests.fakes.runner import TransferRunner
from tests.unit.helpers import greedy, planned


class Peer:
    """Records what the scheduler asks of a prefill peer."""

    def __init__(self, go=True):
        self.go = go
        self.jobs: list[RemoteJob] = []
        self.cancelled: list[str] = []
        self.local: list[tuple[int, float]] = []
        self.imports: list[int] = []

    def decide(self, num_tokens, num_cached):
        return (True, "always") if self.go else (False, "short_prompt")

    def begin(self, job):
        self.jobs.append(job)

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def observe_local(self, num_tokens, seconds):
        self.local.append((num_tokens, seconds))

    def observe_import(self, num_tokens, seconds):
        self.imports.append(num_tokens)

    def close(self):
        pass


def kv(n):
    z = np.zeros((n, 1, 1), np.float16)
    return [(z, z)]


def setup(go=True, budget=8):
    runner = TransferRunner(num_blocks=64, block_size=4, max_seqs=8)
    eng = LLMEngine(runner, EngineConfig(context_length=1024, scheduler=SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=budget)))
    peer = Peer(go)
    eng.set_remote_prefill(peer)
    return runner, eng, peer


PROMPT = list(range(1, 14))  # 13 tokens: KV wanted for 12, blocks of 4


def test_remote_prompt_is_parked_imported_and_finished_with_its_last_token_here():
    runner, eng, peer = setup()
    req = eng.add_request("a", PROMPT, greedy(3))
    assert eng.step() == []  # admitted and parked: nothing computed
    assert runner.steps == []
    assert req.status is RequestStatus.REMOTE_PREFILL
    assert req.block_table == [0, 1, 2, 3]  # the whole prompt's blocks, for the imports
    (job,) = peer.jobs
    assert (job.request_id, job.token_ids, job.start) == ("a", PROMPT[:-1], 0)
    assert not eng.has_work()  # the step loop may sleep until the peer calls back

    assert eng.import_remote_kv("a", 0, kv(8))
    assert eng.import_remote_kv("a", 8, kv(4))
    assert [c for c in runner.calls if c[0] == "import"] == [("import", 0, 0, 8),
                                                            ("import", 0, 8, 4)]
    assert req.num_computed_tokens == 12
    assert req.num_hashed_blocks == 3  # imported blocks enter the prefix cache
    assert peer.imports == [8, 4]
    eng.end_remote_prefill("a", RemoteOutcome(True, "ok", {"bytes": 96}))
    (out,) = eng.step()
    assert planned(runner) == [(0, 12, 1, [0])]  # only the last prompt token, here
    assert out.token_ids == [14]
    info = req.metrics.remote_prefill
    assert (info["remote"], info["reason"], info["ok"], info["imported_tokens"],
            info["bytes"]) == (True, "always", True, 12, 96)
    assert peer.local == []  # a remote prefill is not a local measurement


def test_other_streams_decode_while_a_prompt_prefills_remotely():
    runner, eng, peer = setup()
    peer.go = False
    eng.add_request("b", [1, 2, 3], greedy(5))
    eng.step()  # b prefilled and decoding
    peer.go = True
    eng.add_request("a", PROMPT, greedy(3))
    outs = [eng.step() for _ in range(3)]
    assert [[o.request_id for o in step] for step in outs] == [["b"], ["b"], ["b"]]
    assert [planned(runner, i) for i in (1, 2, 3)] == [[(0, 3, 1, [0])], [(0, 4, 1, [0])],
                                                       [(0, 5, 1, [0])]]


def test_failure_resumes_local_prefill_from_the_last_imported_chunk():
    runner, eng, peer = setup()
    req = eng.add_request("a", PROMPT, greedy(1))
    eng.step()
    eng.import_remote_kv("a", 0, kv(4))
    eng.end_remote_prefill("a", RemoteOutcome(False, "frame_timeout"))
    assert eng.step() == []
    assert planned(runner) == [(0, 4, 8, [])]  # positions 4.. computed here, in budget
    (out,) = eng.step()
    assert planned(runner) == [(0, 12, 1, [0])]
    assert out.token_ids == [14] and out.finished
    info = req.metrics.remote_prefill
    assert (info["ok"], info["failure"], info["imported_tokens"]) == (False, "frame_timeout", 4)


def test_an_out_of_order_chunk_ends_the_transfer_and_keeps_what_was_imported():
    runner, eng, peer = setup()
    req = eng.add_request("a", PROMPT, greedy(1))
    eng.step()
    assert eng.import_remote_kv("a", 0, kv(4))
    assert not eng.import_remote_kv("a", 8, kv(4))  # positions 4..7 skipped
    assert peer.cancelled == ["a"]
    assert req.status is RequestStatus.RUNNING and req.num_computed_tokens == 4
    assert not eng.import_remote_kv("a", 4, kv(4))  # late chunks are ignored
    assert req.metrics.remote_prefill["failure"] == "out_of_order"
    eng.end_remote_prefill("a", RemoteOutcome(True, "ok"))  # too late: ignored
    eng.step()
    assert planned(runner) == [(0, 4, 8, [])]


def test_a_refused_import_recomputes_the_prompt_from_scratch():
    runner, eng, peer = setup()
    req = eng.add_request("a", PROMPT, greedy(1))
    eng.step()
    eng.import_remote_kv("a", 0, kv(4))
    runner.refuse_import = True
    assert not eng.import_remote_kv("a", 4, kv(4))
    assert ("truncate", 0, 0) in runner.calls
    assert req.num_computed_tokens == 0 and req.metrics.remote_prefill["failure"] == "import"


def test_abort_while_remote_frees_the_blocks_and_cancels_the_transfer():
    runner, eng, peer = setup()
    req = eng.add_request("a", PROMPT, greedy(1))
    eng.step()
    eng.import_remote_kv("a", 0, kv(8))
    out = eng.abort("a")
    assert out.finished and out.finish_reason == "abort"
    assert peer.cancelled == ["a"]
    assert eng.scheduler.remote_prefilling == []
    assert eng.block_manager.num_used_blocks == 0
    assert ("release", 0, 2) in runner.calls  # the two imported full blocks stay cached
    assert not eng.import_remote_kv("a", 8, kv(4))
    assert req.finished


def test_policy_says_local_and_a_cache_hit_is_not_sent():
    runner, eng, peer = setup(go=False)
    req = eng.add_request("a", PROMPT, greedy(1))
    while eng.has_work():
        eng.step()
    assert peer.jobs == [] and req.metrics.remote_prefill == {"remote": False,
                                                                "reason": "short_prompt"}
    peer.go = True
    eng.add_request("b", PROMPT + [20, 21, 22, 23], greedy(1))
    eng.step()
    (job,) = peer.jobs
    assert job.start == 12  # the three blocks a's prompt left in the cache
    assert job.token_ids == PROMPT + [20, 21, 22]
    assert [n for n, _ in peer.local] == [13]  # a's local prefill, for the policy


def test_no_remote_prefill_without_kv_import_or_with_a_draft_model():
    from tests.fakes.runner import FakeRunner

    eng = LLMEngine(FakeRunner())
    try:
        eng.set_remote_prefill(Peer())
    except ValueError as e:
        assert str(e) == "this backend cannot import KV from a prefill peer"
    else:
        raise AssertionError("accepted a runner without kv_transfer")
