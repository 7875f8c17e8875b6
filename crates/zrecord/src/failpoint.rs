//! Named points inside append and compact where a test can inject a failure or pause a writer,
//! per store handle so that tests running in parallel do not meet each other's points.
//! Armed only with the `testing` feature (or in unit tests); otherwise [`Failpoints::hit`] is an
//! empty inline function.
//!
//! Points: `append:before-data`, `append:before-table`, `append:before-publish`,
//! `compact:staged` (once per batch), `compact:move` (once per record moved),
//! `compact:before-header`, `delete:swapped` (once per record deleted), `sync:before-header`.

/// What a failpoint does when hit.
#[derive(Clone, Debug)]
pub enum Action {
    /// Fail the `n`-th hit from now (1 = the next one) with an injected error, then disarm.
    FailAt(u64),
    /// Block the hitting thread until [`Failpoints::release`] is called.
    Pause,
}

#[cfg(any(test, feature = "testing"))]
mod active {
    use super::Action;
    use std::collections::HashMap;
    use std::sync::{Condvar, Mutex};

    #[derive(Default)]
    struct Registry {
        points: HashMap<String, Action>,
        paused: HashMap<String, usize>,
        released: HashMap<String, bool>,
    }

    /// The failpoints of one store handle.
    #[derive(Default)]
    pub struct Failpoints {
        registry: Mutex<Registry>,
        changed: Condvar,
    }

    impl Failpoints {
        /// Arms `name`.
        pub fn arm(&self, name: &str, action: Action) {
            let mut r = self.registry.lock().unwrap();
            r.released.remove(name);
            r.points.insert(name.to_string(), action);
        }

        /// Disarms `name`.
        pub fn disarm(&self, name: &str) {
            self.registry.lock().unwrap().points.remove(name);
        }

        /// Lets threads paused at `name` go on, and disarms it.
        pub fn release(&self, name: &str) {
            let mut r = self.registry.lock().unwrap();
            r.points.remove(name);
            r.released.insert(name.to_string(), true);
            self.changed.notify_all();
        }

        /// Blocks until a thread is paused at `name`.
        pub fn wait_paused(&self, name: &str) {
            let mut r = self.registry.lock().unwrap();
            while r.paused.get(name).copied().unwrap_or(0) == 0 {
                r = self.changed.wait(r).unwrap();
            }
        }

        /// Called at the point; an error when armed to fail.
        pub fn hit(&self, name: &str) -> Result<(), String> {
            let mut r = self.registry.lock().unwrap();
            match r.points.get_mut(name) {
                None => Ok(()),
                Some(Action::FailAt(n)) => {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        r.points.remove(name);
                        Err(format!("injected failure at {name}"))
                    } else {
                        Ok(())
                    }
                }
                Some(Action::Pause) => {
                    *r.paused.entry(name.to_string()).or_default() += 1;
                    self.changed.notify_all();
                    while !r.released.get(name).copied().unwrap_or(false) {
                        r = self.changed.wait(r).unwrap();
                    }
                    *r.paused.entry(name.to_string()).or_default() -= 1;
                    Ok(())
                }
            }
        }
    }
}

#[cfg(any(test, feature = "testing"))]
pub use active::Failpoints;

/// No failpoints in normal builds.
#[cfg(not(any(test, feature = "testing")))]
#[derive(Default)]
pub struct Failpoints;

#[cfg(not(any(test, feature = "testing")))]
impl Failpoints {
    /// Never fails.
    #[inline(always)]
    pub fn hit(&self, _name: &str) -> Result<(), String> {
        Ok(())
    }
}
