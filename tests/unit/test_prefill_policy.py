"""The two-box policy: remote only when predicted faster, probing once, backing off from a
failing peer for a doubling interval; and the peer settings' errors."""

import pytest

from app.disagg.peer import PeerConfig, PeerConfigError, check_bind, parse_peer, read_secret
from app.disagg.policy import PolicyConfig, PrefillPolicy


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def policy(**kw):
    clock = Clock()
    return PrefillPolicy(PolicyConfig(**kw), bytes_per_token=1000, clock=clock), clock


def test_short_prompts_stay_local_and_long_ones_probe_each_side_once():
    p, _ = policy(min_tokens=256)
    assert p.decide(300, 100) == (False, "short_prompt")  # 200 uncached
    assert p.decide(300, 0) == (True, "probe")
    p.observe_remote({"worker_prefill_s": 1.0, "worker_tokens": 300})
    assert p.decide(300, 0) == (False, "probe_local")
    p.observe_local(300, 3.0)
    assert p.decide(300, 0) == (True, "faster")


def test_estimates_survive_a_restart():
    p, _ = policy()
    p.observe_remote({"worker_prefill_s": 1.0, "worker_tokens": 300, "setup_s": 0.01})
    p.observe_local(300, 3.0)
    q, _ = policy()
    q.load_estimates({**p.estimates(), "link_bps": "junk", "other": 1})
    assert q.estimates() == {"local_rate": 100.0, "remote_rate": 300.0, "setup_s": 0.01,
                             "link_bps": None, "import_s_per_token": None}
    assert q.decide(1000, 0) == (True, "faster")


def test_prediction_from_measured_rates_link_and_import():
    p, _ = policy(chunk_tokens=512)
    p.observe_local(1000, 2.0)  # 500 tok/s here
    p.observe_remote({"worker_prefill_s": 0.5, "worker_tokens": 1000, "setup_s": 0.01,
                      "link_gbps": 0.001})  # 2000 tok/s there, 1 MB/s link
    p.observe_import(100, 0.1)  # 1 ms per token
    # local 2000/500 = 4 s; remote 0.01 + max(2000/2000, 2000 * 1000/1e6: the link binds)
    # + 512 * (min(1 ms wire, 0.5 ms compute) + 1 ms import) = 2.778 s
    local, remote = p.predict(2000, 2000)
    assert (local, round(remote, 6)) == (4.0, 2.778)
    assert p.decide(2000, 0) == (True, "faster")
    # 300 uncached of 2000: local 0.6 s, remote 0.01 + max(1.0, 0.3) + 300 * 0.0015 = 1.46 s
    assert p.decide(2000, 1700) == (False, "local_faster")


def test_short_local_prefills_do_not_count_as_a_speed():
    p, _ = policy()
    p.observe_local(20, 0.05)
    assert p.local_rate is None


def test_breaker_doubles_its_backoff_and_a_success_resets_it():
    p, clock = policy(mode="always", backoff_s=5, max_backoff_s=12)
    p.observe_failure("frame_timeout")
    assert p.decide(1000, 0) == (False, "peer_backoff")
    clock.t += 5
    assert p.decide(1000, 0) == (True, "always")
    p.observe_failure("refused")
    clock.t += 9.9
    assert p.decide(1000, 0) == (False, "peer_backoff")  # 10 s this time
    clock.t += 0.1
    p.observe_failure("refused")
    clock.t += 11.9
    assert p.decide(1000, 0) == (False, "peer_backoff")  # capped at 12 s
    clock.t += 0.1
    assert p.decide(1000, 0) == (True, "always")
    p.observe_remote({})
    p.observe_failure("checksum")
    assert p.snapshot()["backoff_s"] == 5.0


def test_a_busy_peer_is_not_a_failure():
    p, _ = policy(mode="always")
    p.observe_failure("busy")
    assert p.decide(1000, 0) == (True, "always")


def test_policy_config_errors():
    with pytest.raises(ValueError, match="prefill policy must be auto or always, not 'x'"):
        PolicyConfig(mode="x")


def test_secret_file_errors(tmp_path):
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    with pytest.raises(PeerConfigError, match=r"the secret in .*short is 3 bytes; at least 16"):
        read_secret(short)
    with pytest.raises(PeerConfigError, match="cannot read the secret file .*missing: No such"):
        read_secret(tmp_path / "missing")
    good = tmp_path / "good"
    good.write_text("  " + "k" * 32 + "\n")
    good.chmod(0o600)
    assert read_secret(good) == b"k" * 32
    assert read_secret(None) == b""


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_open_to_other_users_is_refused(tmp_path, mode):
    # as ssh refuses such a key: `> tandem-peer.secret` in a shell gives 0644
    path = tmp_path / "tandem peer.secret"
    path.write_text("k" * 64 + "\n")
    path.chmod(mode)
    with pytest.raises(PeerConfigError) as err:
        read_secret(path)
    assert str(err.value) == (f"the secret file {path} is open to other users (mode "
                              f"{mode:04o}); run: chmod 600 '{path}'")
    path.chmod(0o600)
    assert read_secret(path) == b"k" * 64
    path.chmod(0o400)
    assert read_secret(path) == b"k" * 64


def test_binding_or_peering_off_loopback_needs_a_secret():
    check_bind("127.0.0.1", b"")
    check_bind("::1", b"")
    check_bind("localhost", b"")
    check_bind("0.0.0.0", b"s" * 16)
    with pytest.raises(PeerConfigError, match="binding 0.0.0.0 exposes .* pass --secret-file"):
        check_bind("0.0.0.0", b"")
    with pytest.raises(PeerConfigError, match="a prefill peer at 10.0.0.2 needs --secret-file"):
        PeerConfig("10.0.0.2", 7070)
    assert PeerConfig("10.0.0.2", 7070, b"s" * 16).port == 7070


@pytest.mark.parametrize("text, parsed", [("10.0.0.2:7070", ("10.0.0.2", 7070)),
                                          ("[::1]:7071", ("::1", 7071)),
                                          ("spark.local:7070", ("spark.local", 7070)),
                                          ("spark", ("spark", 7070)),
                                          ("[::1]", ("::1", 7070))])
def test_parse_peer(text, parsed):
    assert parse_peer(text) == parsed


@pytest.mark.parametrize("text", ["", "spark:", ":7070", "spark:99999", "spark:x"])
def test_parse_peer_errors(text):
    with pytest.raises(PeerConfigError, match="--prefill-peer must be HOST or HOST:PORT"):
        parse_peer(text)


def test_the_workers_queue_sends_a_prompt_back_when_waiting_is_slower():
    p, _ = policy(chunk_tokens=512)
    # unknown worker speed: it stays (the probe measures it)
    assert p.decide_queue(2000, 2000, 5000) == (True, {})
    p.observe_local(1000, 2.0)  # 500 tok/s here
    p.observe_remote({"worker_prefill_s": 0.5, "worker_tokens": 1000})  # 2000 tok/s there
    # local 4 s; remote 1 s (no link or import measured); 2000 tokens ahead wait 1 s:
    # 2 s * MARGIN 1.1 < 4 s, it stays
    go, numbers = p.decide_queue(2000, 2000, 2000)
    assert go and numbers == {"wait_s": 1.0, "local_s": 4.0, "remote_s": 2.0}
    # 6000 tokens ahead wait 3 s: 4 s * 1.1 remote, slower than 4 s here
    go, numbers = p.decide_queue(2000, 2000, 6000)
    assert not go and (numbers["wait_s"], numbers["remote_s"]) == (3.0, 4.0)
    # a queue is not a failure: the breaker stays closed
    p.observe_failure("worker_queue")
    assert p.decide(2000, 0) == (True, "faster")
    # --prefill-policy always waits whatever the queue
    q, _ = policy(mode="always")
    q.observe_remote({"worker_prefill_s": 0.5, "worker_tokens": 1000})
    assert q.decide_queue(2000, 2000, 10**6) == (True, {"wait_s": 500.0})


def test_a_transfer_that_computed_nothing_is_no_speed():
    p, _ = policy()
    p.observe_remote({"worker_prefill_s": 0.01, "worker_tokens": 0})  # all in its cache
    assert p.remote_rate is None
