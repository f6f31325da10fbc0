"""SessionStore.load: one client's session read by its own keys equals what load_all finds for it."""

from __future__ import annotations

from twisted.internet import task

from store.kv import DurableKV
from store.session_store import SessionStore, StoredSubscription


def test_load_reads_one_session_like_load_all(tmp_path):
    """Sessions whose ids prefix each other ("a", "ab") stay apart; pending writes count; unknown ids are None."""
    clock = task.Clock()
    db = SessionStore(DurableKV(str(tmp_path), clock))
    for cid in ("a", "ab", "b"):
        db.save_session(cid, 60, 5, None)
        db.save_subscription(cid, "t/" + cid, StoredSubscription("t/" + cid, 1, next_offset=len(cid)))
        db.save_subscription(cid, "$share/g/s", StoredSubscription("s", 2, share_group="g"))
        db.save_outbound(cid, 7, "t/" + cid, 3, 1)
        db.save_released(cid, 8)
        db.save_inbound_qos2(cid, 9)
    clock.advance(0)
    db.save_inbound_qos2("a", 300)  # staged, not yet committed
    everything = db.load_all()
    for cid in ("a", "ab", "b"):
        assert db.load(cid) == everything[cid]
    assert db.load("a").inbound_qos2 == {9, 300}
    assert db.load("abc") is None
    db.kv.close()
