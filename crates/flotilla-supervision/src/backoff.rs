//! Exponential backoff: the one rule for how long to wait before trying a
//! failed thing again (a crashed child, a replica's constructor, a commit).

use std::time::Duration;

/// Waits that start at `first` and double per consecutive failure, at most
/// `max`.
///
/// ```
/// use std::time::Duration;
/// use flotilla_supervision::Backoff;
/// let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(50));
/// let waits: Vec<_> = (1..=5).map(|n| b.after(n).as_millis()).collect();
/// assert_eq!(waits, [10, 20, 40, 50, 50]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    /// Start at `first`, double, never above `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff { first, max }
    }

    /// The wait after `failures` consecutive failures: `first` after the
    /// first (and after none), doubling per failure since, at most `max`.
    pub fn after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_first_and_saturates_at_max() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let ms: Vec<u128> = (0..=8).map(|n| b.after(n).as_millis()).collect();
        assert_eq!(ms, [100, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(b.after(u32::MAX), Duration::from_secs(5));
        let huge = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.after(40), Duration::MAX);
    }
}
