"""A drive's lease as a state machine (runner/engine/drive/lease.py): every named transition
goes where the table says, and a move the table does not allow is refused as a bug."""

from __future__ import annotations

import pytest

from qjsflow.runner.engine.drive.lease import LeaseState, LeaseStateError, LeaseWatch

READ, TAKEN, RENEWING = LeaseState.READ, LeaseState.TAKEN, LeaseState.RENEWING
ENDING, RELEASED, LOST = LeaseState.ENDING, LeaseState.RELEASED, LeaseState.LOST


def test_a_lease_read_late_is_taken_by_the_heartbeat_then_renewed() -> None:
    watch = LeaseWatch(read=True)
    assert watch.state is READ
    assert watch.heartbeat_takes() is True  # a fenced transaction takes it
    assert watch.state is TAKEN
    assert watch.heartbeat_takes() is False  # then it is renewed
    assert watch.state is RENEWING
    watch.renewed()
    assert watch.state is TAKEN


def test_a_lease_read_late_is_taken_by_the_ends_own_update_unless_an_op_took_it() -> None:
    quiet = LeaseWatch(read=True)
    assert quiet.end_begins(ops_seen=0) is True
    assert quiet.ending
    quiet.end_written(released=False)  # driven again at once: the end wrote it, held
    assert quiet.state is TAKEN
    busy = LeaseWatch(read=True)
    assert busy.end_begins(ops_seen=3) is False  # an op's write took it
    assert busy.state is TAKEN
    busy.end_written(released=True)
    assert busy.state is RELEASED


def test_a_lease_taken_first_is_never_taken_by_the_end() -> None:
    watch = LeaseWatch(read=False)
    assert watch.end_begins(ops_seen=0) is False
    assert watch.state is TAKEN


def test_a_renewal_that_answers_after_the_end_leaves_it_released() -> None:
    watch = LeaseWatch(read=False)
    watch.heartbeat_takes()
    watch.end_written(released=True)
    watch.renewed()  # the heartbeat's answer came late: nothing to take back
    assert watch.state is RELEASED


@pytest.mark.parametrize("read", [True, False])
def test_a_live_lease_can_be_lost_and_a_released_one_has_nothing_to_lose(read: bool) -> None:
    watch = LeaseWatch(read=read)
    watch.lose()
    assert watch.lost
    watch.lose()  # stopped twice: still lost
    assert watch.lost
    done = LeaseWatch(read=read)
    done.end_begins(ops_seen=0)
    done.end_written(released=True)
    done.lose()
    assert done.state is RELEASED


def test_a_move_the_table_does_not_allow_is_refused() -> None:
    watch = LeaseWatch(read=False)
    watch.end_written(released=True)
    with pytest.raises(LeaseStateError, match="from released to renewing"):
        watch.heartbeat_takes()  # a heartbeat after the drive released its lease is a bug
    assert watch.state is RELEASED
    lost = LeaseWatch(read=True)
    lost.lose()
    lost.end_written(released=True)  # an end that raced the loss: the lease stays lost
    assert lost.lost


def test_a_renewal_refused_after_the_end_released_the_lease_does_not_stop_the_drive() -> None:
    """The drive's end gave the lease up while a renewal was in flight: the renewal's refusal
    is not a loss (the drive has its result; it must not be cancelled as taken over)."""
    watch = LeaseWatch(read=False)
    watch.heartbeat_takes()
    watch.end_written(released=True)
    watch.lose()
    assert watch.released
    assert not watch.lost
