"""A live server runs OpenCV one thread a call (session.live_opencv_threads): its variable overrides, a bad value
is refused with the variable's name."""
import pytest

cv2 = pytest.importorskip("cv2")


@pytest.fixture
def restore_threads():
    before = cv2.getNumThreads()
    yield
    cv2.setNumThreads(before)


def test_live_server_runs_opencv_on_one_thread(monkeypatch, restore_threads):
    from digital_human.pipeline.live.session import OPENCV_THREADS_ENV, SessionManager

    monkeypatch.delenv(OPENCV_THREADS_ENV, raising=False)
    cv2.setNumThreads(2)
    manager = SessionManager(face=None, voice=None, max_sessions=2)
    assert manager.opencv_threads == cv2.getNumThreads() == 1


def test_opencv_threads_variable(monkeypatch, restore_threads):
    from digital_human.pipeline.live.session import OPENCV_THREADS_ENV, live_opencv_threads

    monkeypatch.setenv(OPENCV_THREADS_ENV, "2")
    assert live_opencv_threads() == 2
    monkeypatch.setenv(OPENCV_THREADS_ENV, "many")
    with pytest.raises(ValueError, match=OPENCV_THREADS_ENV):
        live_opencv_threads()


@pytest.fixture
def restore_switch_interval():
    import sys

    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_live_server_shortens_the_switch_interval(monkeypatch, restore_switch_interval):
    """0.5 ms by default (the sessions' threads win the interpreter lock back sooner after each numpy/OpenCV/CUDA
    call), its variable overrides, a bad value is refused naming the variable."""
    import sys

    from digital_human.pipeline.live.session import SWITCH_INTERVAL_ENV, SessionManager, live_switch_interval

    monkeypatch.delenv(SWITCH_INTERVAL_ENV, raising=False)
    sys.setswitchinterval(0.005)
    manager = SessionManager(face=None, voice=None, max_sessions=2)
    assert manager.switch_interval_ms == 0.5 and abs(sys.getswitchinterval() - 0.0005) < 1e-9
    monkeypatch.setenv(SWITCH_INTERVAL_ENV, "2")
    assert live_switch_interval() == 2.0
    for bad in ("0", "-1", "fast"):
        monkeypatch.setenv(SWITCH_INTERVAL_ENV, bad)
        with pytest.raises(ValueError, match=SWITCH_INTERVAL_ENV):
            live_switch_interval()
