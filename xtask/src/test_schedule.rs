//! Which job of `cargo xtask test` runs when: the classes' rules for what may run
//! beside what ([`may_start`]), the queue the workers share ([`Board`]: a job waits for
//! the build it needs), and the order of that queue ([`order`]: the alone jobs first,
//! then the builds, then the longest of the last whole run, whose wall times
//! [`keep_walls`] writes and [`last_walls`] reads back).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    path::Path,
    sync::{Condvar, Mutex},
    time::Duration,
};

use crate::test_classes::{self, Class};

/// What the scheduler knows of a job: its class, the binary it belongs to (a build's
/// own name for a build), and the build it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    pub class: Class,
    pub binary: String,
    pub after: Option<String>,
}

impl Lane {
    /// A job of `binary` in `class` that waits for nothing.
    pub fn new(class: Class, binary: impl Into<String>) -> Lane {
        Lane {
            class,
            binary: binary.into(),
            after: None,
        }
    }
}

/// A job the [`Board`] hands out: its lane and its name.
pub trait Scheduled {
    fn lane(&self) -> &Lane;
    fn name(&self) -> &str;
}

/// Waiting jobs at once at most.
pub const WAITING_AT_ONCE: usize = 3;

/// Jobs at once at most: the waiting ones, one light and one build.
pub const WORKERS: usize = WAITING_AT_ONCE + 2;

/// Whether `job` may start beside the jobs `running`:
/// - light: one at a time, beside anything but an alone job;
/// - timed: no other timed or waiting job beside it (light ones may run);
/// - waiting: beside at most two other waiting jobs (and a light one);
/// - alone: no other test beside it, but the other tests of its own binary where that
///   binary allows it ([`test_classes::beside_itself`]);
/// - build: beside anything, one at a time (it runs at idle CPU priority: no test waits
///   for a CPU because of it).
pub fn may_start(job: &Lane, running: &[Lane]) -> bool {
    let n = |c: Class| running.iter().filter(|r| r.class == c).count();
    if job.class == Class::Build {
        return n(Class::Build) == 0;
    }
    let tests = || running.iter().filter(|r| r.class != Class::Build);
    if job.class == Class::Alone {
        return tests().next().is_none()
            || (test_classes::beside_itself(&job.binary) && tests().all(|r| *r == *job));
    }
    if n(Class::Alone) > 0 {
        return false;
    }
    match job.class {
        Class::Light => n(Class::Light) == 0,
        Class::Timed => n(Class::Timed) + n(Class::Waiting) == 0,
        Class::Waiting => n(Class::Timed) == 0 && n(Class::Waiting) < WAITING_AT_ONCE,
        Class::Alone | Class::Build => unreachable!("handled above"),
    }
}

/// The index of the first job in `queue` that may start beside `running` and whose
/// build has ended (is not in `unbuilt`).
pub fn pick(queue: &[Lane], running: &[Lane], unbuilt: &HashSet<String>) -> Option<usize> {
    queue.iter().position(|j| {
        j.after.as_ref().is_none_or(|b| !unbuilt.contains(b)) && may_start(j, running)
    })
}

/// Sorts `queue` into the order the workers take it: the alone jobs first, while the
/// machine is empty anyway; then the builds, in the order they were queued, to start as
/// soon as the alone jobs are done; then the rest, longest first by the last whole run's
/// wall times `last` (jobs it does not list first, then name order), so that no long
/// job starts at the end (each worker takes the first job the others' classes let it
/// start).
pub fn order<T: Scheduled>(queue: &mut [T], last: &HashMap<String, f64>) {
    let rank = |j: &T| match j.lane().class {
        Class::Alone => 0,
        Class::Build => 1,
        _ => 2,
    };
    queue.sort_by(|a, b| {
        let longest = |j: &T| std::cmp::Reverse(last.get(j.name()).copied().unwrap_or(f64::MAX));
        rank(a).cmp(&rank(b)).then_with(|| {
            if rank(a) == 1 {
                // Builds keep their order (the sort is stable).
                return std::cmp::Ordering::Equal;
            }
            longest(a)
                .partial_cmp(&longest(b))
                .expect("no NaN")
                .then(a.name().cmp(b.name()))
        })
    });
}

/// The file, in the logs' directory, that keeps each job's wall time from the last
/// whole run.
const WALLS_FILE: &str = "walls.tsv";

/// The wall times of a whole run kept in the repository (a copy of a [`WALLS_FILE`]):
/// the order of a clone that has run no whole suite yet, as CI's fresh clone. Copy
/// `target/xtask-test/walls.tsv` over it when jobs come, go or change length.
pub const KEPT_WALLS: &str = "xtask/walls.tsv";

/// Each job's wall time in seconds from the last whole run's [`WALLS_FILE`] in `logs`,
/// else from `kept` (empty when neither can be read; a line that cannot be read is
/// left out).
pub fn last_walls(logs: &Path, kept: &Path) -> HashMap<String, f64> {
    let text = std::fs::read_to_string(logs.join(WALLS_FILE))
        .or_else(|_| std::fs::read_to_string(kept))
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (secs, name) = l.split_once('\t')?;
            Some((name.to_owned(), secs.parse().ok()?))
        })
        .collect()
}

/// Writes each job's wall time for the next run's order (best effort: a run that cannot
/// write it only loses the order).
pub fn keep_walls<'a>(logs: &Path, walls: impl IntoIterator<Item = (&'a str, Duration)>) {
    let text: String = walls
        .into_iter()
        .map(|(name, wall)| format!("{:.1}\t{name}\n", wall.as_secs_f64()))
        .collect();
    if let Err(e) = std::fs::write(logs.join(WALLS_FILE), text) {
        println!("xtask test: note: keeping the jobs' times: {e}");
    }
}

/// The jobs not yet started and the lanes of those running, shared by the workers.
pub struct Board<T> {
    state: Mutex<BoardState<T>>,
    changed: Condvar,
}

struct BoardState<T> {
    queue: VecDeque<T>,
    running: Vec<Lane>,
    /// The builds queued or running: the jobs that wait for one of them may not start.
    unbuilt: HashSet<String>,
}

impl<T: Scheduled> Board<T> {
    /// A board with `queue`, taken in its order.
    pub fn new(queue: impl IntoIterator<Item = T>) -> Self {
        let queue: VecDeque<T> = queue.into_iter().collect();
        let unbuilt = queue
            .iter()
            .filter(|j| j.lane().class == Class::Build)
            .map(|j| j.lane().binary.clone())
            .collect();
        Board {
            state: Mutex::new(BoardState {
                queue,
                running: Vec::new(),
                unbuilt,
            }),
            changed: Condvar::new(),
        }
    }

    /// The next job this worker may start, waiting until one may; None once the
    /// queue is empty.
    pub fn take(&self) -> Option<T> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if st.queue.is_empty() {
                return None;
            }
            let lanes: Vec<Lane> = st.queue.iter().map(|j| j.lane().clone()).collect();
            if let Some(i) = pick(&lanes, &st.running, &st.unbuilt) {
                let job = st.queue.remove(i).expect("picked from the queue");
                st.running.push(job.lane().clone());
                return Some(job);
            }
            // Something runs (with nothing running every class may start, and a job
            // waits only for a build queued or running): wait for it.
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The job of `lane` has ended (a build: whether or not it succeeded, the jobs that
    /// wait for it may start, and fail on their own if it left nothing).
    pub fn done(&self, lane: &Lane) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = st.running.iter().position(|r| r == lane) {
            st.running.remove(i);
        }
        if lane.class == Class::Build {
            st.unbuilt.remove(&lane.binary);
        }
        self.changed.notify_all();
    }

    /// The lanes running now.
    #[cfg(test)]
    fn running(&self) -> Vec<Lane> {
        self.state.lock().unwrap().running.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, thread};

    use super::*;

    /// A job of class `class` from binary `binary`.
    fn lane(class: Class, binary: &str) -> Lane {
        Lane::new(class, binary)
    }

    /// Jobs of each class from binaries of their own.
    fn lanes(classes: &[Class]) -> Vec<Lane> {
        classes
            .iter()
            .enumerate()
            .map(|(i, c)| lane(*c, &format!("bin{i}")))
            .collect()
    }

    fn may(class: Class, running: &[Class]) -> bool {
        may_start(&lane(class, "this"), &lanes(running))
    }

    #[test]
    fn classes_start_only_beside_the_classes_they_allow() {
        use Class::*;
        assert!(may(Alone, &[]));
        assert!(!may(Alone, &[Light]));
        assert!(!may(Light, &[Alone]) && !may(Waiting, &[Alone]));
        assert!(may(Light, &[Waiting, Waiting, Waiting]) && may(Light, &[Timed]));
        assert!(!may(Light, &[Light]));
        assert!(may(Waiting, &[Waiting, Waiting, Light]));
        assert!(!may(Waiting, &[Waiting, Waiting, Waiting]));
        assert!(!may(Waiting, &[Timed]) && !may(Timed, &[Waiting]));
        assert!(!may(Timed, &[Timed]) && may(Timed, &[Light]));
    }

    #[test]
    fn an_alone_binary_runs_beside_its_own_tests_only_where_it_allows_it() {
        use Class::*;
        let chaos = lane(Alone, "netns_chaos");
        assert!(test_classes::beside_itself("netns_chaos"));
        assert!(may_start(&chaos, std::slice::from_ref(&chaos)));
        assert!(!may_start(
            &chaos,
            &[chaos.clone(), lane(Light, "bpf_fixtures")]
        ));
        assert!(!may_start(
            &lane(Light, "bpf_fixtures"),
            std::slice::from_ref(&chaos)
        ));
        let starved = lane(Alone, "netns_health_starved_agent");
        assert!(!may_start(&starved, std::slice::from_ref(&starved)));
        assert!(!may_start(&starved, std::slice::from_ref(&chaos)));
        assert!(!may_start(&chaos, &[starved]));
    }

    #[test]
    fn a_worker_takes_the_first_job_it_may_start() {
        use Class::*;
        // A timed job waits while waiting ones run; the light job behind it goes first.
        let full = [Waiting, Waiting, Waiting];
        let none = HashSet::new();
        assert_eq!(pick(&lanes(&[Timed, Light]), &lanes(&full), &none), Some(1));
        assert_eq!(
            pick(&lanes(&[Timed, Waiting]), &lanes(&[Waiting, Light]), &none),
            Some(1)
        );
        assert_eq!(
            pick(&lanes(&[Alone, Timed]), &lanes(&[Light]), &none),
            Some(1)
        );
        assert_eq!(pick(&lanes(&[Alone, Light]), &lanes(&[Alone]), &none), None);
    }

    /// A job of the tests below.
    struct Named(String, Lane);

    impl Scheduled for Named {
        fn lane(&self) -> &Lane {
            &self.1
        }
        fn name(&self) -> &str {
            &self.0
        }
    }

    /// Works off `queue` with [`WORKERS`] threads as the runner does: each job is logged
    /// as "NAME start", handed to `during` (with the board and the log so far), held for
    /// 20 ms and logged as "NAME end". Returns the log.
    fn work_off(
        queue: Vec<Named>,
        during: impl Fn(&Board<Named>, &Named, &Mutex<Vec<String>>) + Send + Sync + 'static,
    ) -> Vec<String> {
        let board = Arc::new(Board::new(queue));
        let log = Arc::new(Mutex::new(Vec::new()));
        let during = Arc::new(during);
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (board, log, during) = (board.clone(), log.clone(), during.clone());
                thread::spawn(move || {
                    while let Some(job) = board.take() {
                        log.lock().unwrap().push(format!("{} start", job.name()));
                        during(&board, &job, &log);
                        thread::sleep(Duration::from_millis(20));
                        log.lock().unwrap().push(format!("{} end", job.name()));
                        board.done(job.lane());
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        std::mem::take(&mut *log.lock().unwrap())
    }

    #[test]
    fn every_job_runs_and_an_alone_job_runs_by_itself() {
        use Class::*;
        let classes = [
            Waiting, Light, Alone, Waiting, Timed, Waiting, Light, Timed, Waiting, Waiting,
        ];
        let queue = lanes(&classes)
            .into_iter()
            .enumerate()
            .map(|(i, lane)| Named(format!("job{i}"), lane))
            .collect();
        let log = work_off(queue, |board, job, _| {
            // `running` holds this job's own lane once.
            let mut others = board.running();
            let i = others.iter().position(|l| l == job.lane()).unwrap();
            others.remove(i);
            assert!(
                may_start(job.lane(), &others),
                "{} beside {others:?}",
                job.name()
            );
        });
        assert_eq!(
            log.iter().filter(|l| l.ends_with(" end")).count(),
            classes.len()
        );
    }

    #[test]
    fn alone_jobs_go_first_then_the_builds_then_the_longest_of_the_last_run() {
        use Class::*;
        let job = |name: &str, class| Named(name.into(), lane(class, name));
        let mut queue = vec![
            job("short", Waiting),
            job("release", Build),
            job("new", Light),
            job("package", Build),
            job("long", Waiting),
            job("chaos", Alone),
        ];
        let last = HashMap::from([
            ("short".to_owned(), 3.0),
            ("long".to_owned(), 60.0),
            ("package".to_owned(), 200.0),
            ("release".to_owned(), 20.0),
        ]);
        order(&mut queue, &last);
        let names: Vec<&str> = queue.iter().map(|j| j.name()).collect();
        assert_eq!(
            names,
            ["chaos", "release", "package", "new", "long", "short"]
        );
    }

    #[test]
    fn a_build_runs_beside_any_test_and_its_jobs_wait_for_it() {
        use Class::*;
        let build = lane(Build, "package");
        let mut install = lane(Timed, "package_install");
        install.after = Some("package".into());
        let unbuilt = HashSet::from(["package".to_owned()]);
        // A build beside any test, alone ones included, but one build at a time.
        let chaos = lane(Alone, "netns_chaos");
        assert!(may_start(&build, std::slice::from_ref(&chaos)));
        assert!(may_start(
            &build,
            &lanes(&[Waiting, Waiting, Waiting, Light])
        ));
        assert!(!may_start(&build, std::slice::from_ref(&build)));
        // It takes no place of the tests' lanes, nor keeps an alone job waiting.
        assert!(may(Light, &[Build]) && may(Timed, &[Build]) && may(Alone, &[Build]));
        assert!(may_start(&chaos, &[chaos.clone(), build.clone()]));
        assert!(!may(Light, &[Alone, Build]));
        // The job that needs it waits until it has ended, whatever else could start.
        assert_eq!(
            pick(
                std::slice::from_ref(&install),
                std::slice::from_ref(&build),
                &unbuilt
            ),
            None
        );
        assert_eq!(pick(&[install], &[], &HashSet::new()), Some(0));
    }

    #[test]
    fn a_job_waiting_for_a_build_runs_after_it_through_the_board() {
        use Class::*;
        let mut install = lane(Timed, "package_install");
        install.after = Some("package".into());
        let queue = vec![
            Named("install".into(), install),
            Named("chaos".into(), lane(Alone, "chaos")),
            Named("package".into(), lane(Build, "package")),
            Named("wait".into(), lane(Waiting, "wait")),
        ];
        let seen = work_off(queue, |_, job, log| {
            if job.name() == "chaos" {
                // The alone job ends only once the build has started beside it (or after
                // 10 s, and the order below fails).
                for _ in 0..1000 {
                    if log.lock().unwrap().iter().any(|s| s == "package start") {
                        break;
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }
        });
        let at = |e: &str| seen.iter().position(|s| s == e).unwrap();
        // The build starts beside the alone job, which goes first; the waiting job only
        // after the alone one.
        assert!(at("package start") < at("chaos end"), "{seen:?}");
        assert!(at("chaos end") < at("wait start"), "{seen:?}");
        assert!(at("package end") < at("install start"), "{seen:?}");
    }

    #[test]
    fn the_last_runs_walls_are_read_back() {
        let dir = std::env::temp_dir().join(format!("xtask-walls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        keep_walls(
            &dir,
            [
                ("a::b", Duration::from_secs(12)),
                ("c", Duration::from_secs(3)),
            ],
        );
        let kept = dir.join("kept.tsv");
        let walls = last_walls(&dir, &kept);
        assert_eq!(walls.get("a::b"), Some(&12.0));
        assert_eq!(walls.get("c"), Some(&3.0));
        std::fs::remove_file(dir.join(WALLS_FILE)).unwrap();
        assert!(last_walls(&dir, &kept).is_empty());
        // A clone that has run no whole suite orders by the kept copy.
        std::fs::write(&kept, "7.5\tlong\n").unwrap();
        assert_eq!(last_walls(&dir, &kept).get("long"), Some(&7.5));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
