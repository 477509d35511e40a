//! Each route's HTTP request counters: lock-free slots by method and status.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use flotilla::{HistogramSnapshot, LatencyHistogram};

/// HTTP methods with a slot of their own; any other is `OTHER`.
const METHODS: [&str; 9] = [
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE",
];

/// The index of `method` among [`METHODS`] (`METHODS.len()` for any other).
pub(crate) fn method_index(method: &http::Method) -> u8 {
    let m = method.as_str();
    METHODS
        .iter()
        .position(|x| *x == m)
        .unwrap_or(METHODS.len()) as u8
}

/// The method of index `i` ([`method_index`]).
pub(crate) fn method_name(i: u8) -> &'static str {
    METHODS.get(usize::from(i)).copied().unwrap_or("OTHER")
}

/// Lock-free slots per route: the first (method, status) pairs one route
/// answers with. Pairs beyond them are counted under a lock, still apart.
const SLOTS: usize = 16;

/// One (method, status) pair's counters.
#[derive(Default)]
struct Slot {
    /// 0 = free; else `(method + 1) << 16 | status`.
    key: AtomicU32,
    latency: LatencyHistogram,
}

/// One route's HTTP request counters (Ray's `serve_num_http_requests`, its
/// error counters and `serve_http_request_latency_ms`), by method and status.
pub(crate) struct HttpStats {
    /// The `route` label: the route prefix ("" for unmatched requests).
    pub(crate) route: String,
    /// The `application` label.
    pub(crate) app: String,
    /// The ingress deployment ("" for unmatched).
    pub(crate) deployment: String,
    slots: [Slot; SLOTS],
    /// Pairs beyond [`SLOTS`], by the same key as a slot's. Bounded: ten
    /// method indexes times the statuses a response can have.
    overflow: std::sync::Mutex<BTreeMap<u32, LatencyHistogram>>,
}

impl std::fmt::Debug for HttpStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpStats")
            .field("route", &self.route)
            .field("app", &self.app)
            .finish()
    }
}

impl HttpStats {
    pub(crate) fn new(route: &str, app: &str, deployment: &str) -> Self {
        HttpStats {
            route: route.to_owned(),
            app: app.to_owned(),
            deployment: deployment.to_owned(),
            slots: Default::default(),
            overflow: std::sync::Mutex::default(),
        }
    }

    /// Record one request: O(slots) atomic loads at worst, one CAS the first time
    /// a pair is seen, then the histogram's adds (a lock and a map lookup for
    /// a pair beyond the slots).
    pub(crate) fn record(&self, method: u8, status: u16, latency: Duration) {
        let key = (u32::from(method) + 1) << 16 | u32::from(status);
        for slot in &self.slots {
            let k = slot.key.load(Ordering::Acquire);
            let mine = k == key
                || (k == 0
                    && match slot
                        .key
                        .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                    {
                        Ok(_) => true,
                        Err(now) => now == key,
                    });
            if mine {
                slot.latency.record(latency);
                return;
            }
        }
        self.overflow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key)
            .or_default()
            .record(latency);
    }

    /// `(method, status, latency)` of every pair seen.
    pub(crate) fn read(&self) -> Vec<(&'static str, String, HistogramSnapshot)> {
        let pair = |k: u32, h: &LatencyHistogram| {
            (
                method_name(((k >> 16) - 1) as u8),
                (k & 0xFFFF).to_string(),
                h.snapshot(),
            )
        };
        let mut out: Vec<_> = self
            .slots
            .iter()
            .filter_map(|s| {
                let k = s.key.load(Ordering::Acquire);
                (k != 0).then(|| pair(k, &s.latency))
            })
            .collect();
        let over = self
            .overflow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        out.extend(over.iter().map(|(k, h)| pair(*k, h)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_keep_each_method_and_status_apart_beyond_the_slots_too() {
        let s = HttpStats::new("/a", "app", "front");
        let get = method_index(&http::Method::GET);
        s.record(get, 200, Duration::from_millis(3));
        s.record(get, 200, Duration::from_millis(30));
        s.record(
            method_index(&http::Method::POST),
            500,
            Duration::from_millis(1),
        );
        for status in 300..320u16 {
            s.record(get, status, Duration::from_millis(1));
        }
        let read = s.read();
        let find = |m: &str, st: &str| {
            read.iter()
                .find(|(mm, ss, _)| *mm == m && ss == st)
                .map(|(_, _, h)| h.count)
        };
        assert_eq!(find("GET", "200"), Some(2));
        assert_eq!(find("POST", "500"), Some(1));
        // 16 slots, 22 pairs: each still counted under its own labels (a 500
        // after many 4xx pairs still shows as a 500).
        assert_eq!(read.len(), 22);
        for status in 300..320u16 {
            assert_eq!(find("GET", &status.to_string()), Some(1), "{status}");
        }
        s.record(get, 319, Duration::from_millis(1));
        assert_eq!(s.read().iter().filter(|(_, st, _)| st == "319").count(), 1);
        assert_eq!(
            method_name(method_index(
                &http::Method::from_bytes(b"BREW").unwrap_or_default()
            )),
            "OTHER"
        );
    }
}
