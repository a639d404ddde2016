//! Running things at the same time, and keeping the machine for one suite.

/// Taken by the suites that load the machine on purpose (hundreds of held polls) and by those
/// whose checks depend on getting a fair share of it (faults, replicas): the two kinds never
/// run side by side.
pub fn machine_to_itself() -> std::sync::MutexGuard<'static, ()> {
    static MACHINE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MACHINE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `a` and `b` on two threads released at the same instant, and returns both answers:
/// for races that must have one winner.
pub fn at_once<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            barrier.wait();
            a()
        });
        let b = scope.spawn(|| {
            barrier.wait();
            b()
        });
        (a.join().expect("thread"), b.join().expect("thread"))
    })
}

/// Sets a flag that other threads watch when dropped: made before the test's own thread
/// asserts inside a `std::thread::scope`, it lets the watching threads end should an
/// assertion fail, so that the scope (which waits for its threads before a panic leaves it)
/// fails the test instead of hanging.
pub struct SetOnDrop<'a> {
    flag: &'a std::sync::atomic::AtomicBool,
    value: bool,
}

impl<'a> SetOnDrop<'a> {
    pub fn new(flag: &'a std::sync::atomic::AtomicBool, value: bool) -> Self {
        SetOnDrop { flag, value }
    }
}

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.flag
            .store(self.value, std::sync::atomic::Ordering::SeqCst);
    }
}
