//! The process's own figures, the `process_*` series every Prometheus
//! client library exports under these names (so that the usual dashboards
//! and alerts read them): read from `/proc/self` at each scrape, a few
//! small files, no crate needed. On a system without `/proc` they are
//! simply absent.

use std::fs;

use metrics::{counter, describe_counter, describe_gauge, gauge};

/// Ticks per second of `/proc/*/stat`'s times: the kernel reports them in
/// `USER_HZ`, which is 100 on every Linux architecture the service runs on.
const TICKS_PER_SEC: u64 = 100;

const CPU: &str = "process_cpu_seconds_total";
const RESIDENT: &str = "process_resident_memory_bytes";
const VIRTUAL: &str = "process_virtual_memory_bytes";
const OPEN_FDS: &str = "process_open_fds";
const MAX_FDS: &str = "process_max_fds";
const THREADS: &str = "process_threads";
const START_TIME: &str = "process_start_time_seconds";

pub(super) fn describe() {
    describe_counter!(
        CPU,
        "User and system CPU time spent by the process, in whole seconds"
    );
    describe_gauge!(RESIDENT, "Resident memory size in bytes");
    describe_gauge!(VIRTUAL, "Virtual memory size in bytes");
    describe_gauge!(OPEN_FDS, "Open file descriptors");
    describe_gauge!(
        MAX_FDS,
        "The soft limit on open file descriptors (RLIMIT_NOFILE)"
    );
    describe_gauge!(THREADS, "Threads of the process");
    describe_gauge!(
        START_TIME,
        "When the process started, in seconds since the Unix epoch"
    );
}

/// Reads the figures now; any file that cannot be read leaves its series
/// as the last scrape set it.
pub(super) fn sample() {
    if let Some(stat) = Stat::read() {
        counter!(CPU).absolute((stat.utime + stat.stime) / TICKS_PER_SEC);
        if let Some(boot) = boot_time() {
            gauge!(START_TIME).set((boot + stat.starttime / TICKS_PER_SEC) as f64);
        }
    }
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        let kib = |name: &str| field(&status, name).map(|kib| kib * 1024.0);
        if let Some(bytes) = kib("VmRSS:") {
            gauge!(RESIDENT).set(bytes);
        }
        if let Some(bytes) = kib("VmSize:") {
            gauge!(VIRTUAL).set(bytes);
        }
        if let Some(threads) = field(&status, "Threads:") {
            gauge!(THREADS).set(threads);
        }
    }
    if let Ok(fds) = fs::read_dir("/proc/self/fd") {
        gauge!(OPEN_FDS).set(fds.count() as f64);
    }
    if let Ok(limits) = fs::read_to_string("/proc/self/limits") {
        let soft = limits
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|soft| soft.parse::<f64>().ok());
        if let Some(soft) = soft {
            gauge!(MAX_FDS).set(soft);
        }
    }
}

/// What `/proc/self/stat` says of CPU time and the start, in ticks.
struct Stat {
    utime: u64,
    stime: u64,
    starttime: u64,
}

impl Stat {
    fn read() -> Option<Self> {
        let stat = fs::read_to_string("/proc/self/stat").ok()?;
        // The command name, in parentheses, may hold spaces: the fields
        // are counted after its closing one, from the third (`state`).
        let (_, fields) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = fields.split_whitespace().collect();
        let at = |number: usize| fields.get(number - 3)?.parse::<u64>().ok();
        Some(Self {
            utime: at(14)?,
            stime: at(15)?,
            starttime: at(22)?,
        })
    }
}

/// When the machine booted, in seconds since the Unix epoch.
fn boot_time() -> Option<u64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The number after `name` on its line of `/proc/self/status`.
fn field(status: &str, name: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_figures_are_read_from_proc() {
        let stat = super::Stat::read().expect("/proc/self/stat");
        assert!(stat.starttime > 0);
        assert!(super::boot_time().is_some_and(|boot| boot > 1_600_000_000));
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(super::field(&status, "VmRSS:").is_some_and(|kib| kib > 0.0));
    }
}
