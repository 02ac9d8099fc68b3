//! `lb_xdp_full`, the second XDP program: loaded next to `lb_xdp` and put into
//! `LB_PROGRAMS` before `lb_xdp` can run, and kept there after the agent exits; with it
//! `lb_xdp_peer`, the cluster-mode program `lb_xdp_full` tail-calls through the same
//! array (docs/internals/fast-path.md, "Cluster mode").
//!
//! The kernel empties a `PROG_ARRAY` when its last user reference goes (an open fd or a
//! pin): the attached `lb_xdp` outlives the agent (netlink attach), so once attached the
//! array is pinned as `lb_full_path_<lb_xdp's id>` in a bpffs that outlives the agent
//! ([`lasting_dir`]). Where there is none (an agent in a container, or under `ip netns exec` without
//! `pin_path` and without access to init's `/sys/fs/bpf`), the agent attaches
//! `lb_xdp_full` itself: the whole path in one program, as before the split. The next
//! agent's `lb_xdp` has an array of its own (never adopted), pinned under its own id;
//! the pins of programs that are gone or were just replaced are removed, and `lb-agent
//! detach` removes the detached program's pin. docs/internals/fast-path.md, "Two programs".

use std::{
    collections::BTreeSet,
    io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    maps::{Map, ProgramArray},
    programs::{Xdp, loaded_programs},
};
use lb_common::{
    FULL_PATH_INDEX, FULL_PROGRAM_NAME, PEER_PATH_INDEX, PEER_PROGRAM_NAME, map_names,
};

use crate::dataplane::{DataplaneError, adopt::pin};

/// Pin name prefix (followed by `lb_xdp`'s program id).
const PIN_PREFIX: &str = "lb_full_path_";

/// The tail-call targets and their `LB_PROGRAMS` index.
const TARGETS: [(&str, u32); 2] = [
    (FULL_PROGRAM_NAME, FULL_PATH_INDEX),
    (PEER_PROGRAM_NAME, PEER_PATH_INDEX),
];

/// Loads `lb_xdp_full` and `lb_xdp_peer` (the verifier runs) and puts them into
/// `LB_PROGRAMS`. `lb_xdp_peer` is loaded without cluster mode too: the verifier prunes
/// its work there, and `LB_PROGRAMS` is the same in both modes.
pub fn load(ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
    for (name, _) in TARGETS {
        program(ebpf, name)?
            .load()
            .map_err(|source| DataplaneError::Program { name, source })?;
    }
    fill(ebpf)
}

/// Tail-call target `name` in the object.
fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp, DataplaneError> {
    ebpf.program_mut(name)
        .ok_or(DataplaneError::MissingProgram { name })?
        .try_into()
        .map_err(|source| DataplaneError::Program { name, source })
}

/// Puts the loaded tail-call targets into `LB_PROGRAMS` (again: fixtures empty it).
pub fn fill(ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
    for (target, index) in TARGETS {
        let fd = program(ebpf, target)?
            .fd()
            .map_err(|source| DataplaneError::Program {
                name: target,
                source,
            })?
            .try_clone()
            .map_err(|source| DataplaneError::Io {
                what: "duplicating a tail-call target's fd",
                source,
            })?;
        let name = map_names::PROGRAMS;
        let map = ebpf
            .map_mut(name)
            .ok_or(DataplaneError::MissingMap { name })?;
        let mut array =
            ProgramArray::try_from(map).map_err(|source| DataplaneError::Map { name, source })?;
        array
            .set(index, &fd, 0)
            .map_err(|source| DataplaneError::Map { name, source })?;
    }
    Ok(())
}

/// A bpffs directory whose pins outlive this process, if there is one (never in a
/// container: see the body): `pin_path`
/// (unless it lies under `/sys` outside init's mount namespace: `ip netns exec`
/// remounts `/sys`, a bpffs there goes with the agent), init's `/sys/fs/bpf`, or this
/// process's `/sys/fs/bpf` when this is surely init's mount namespace. `None`: the split
/// cannot outlive the agent, which then attaches `lb_xdp_full` itself.
pub fn lasting_dir(pins: Option<&pin::PinDir>) -> Option<PathBuf> {
    // In a PID namespace of its own (a container) `/proc/1` is the container's init,
    // and a bpffs the agent finds or mounts there goes when the container does: the
    // next container's agent would adopt a `lb_xdp` whose `LB_PROGRAMS` the kernel
    // emptied (new flows dropped meanwhile, the flow table not adopted).
    if !in_initial_pid_namespace() {
        return None;
    }
    let private = !in_init_mount_namespace();
    let mut candidates = Vec::new();
    if let Some(p) = pins
        && !(private && p.path().starts_with("/sys"))
    {
        candidates.push(p.path().to_path_buf());
    }
    candidates.push(PathBuf::from(INIT_BPFFS));
    if !private {
        candidates.push(PathBuf::from("/sys/fs/bpf"));
    }
    candidates.into_iter().find(|d| pin::is_bpffs(d))
}

/// The initial PID namespace's inode number (`PROC_PID_INIT_INO` in the kernel: fixed).
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Whether this process is in the host's PID namespace (not a container's); unknown
/// counts as no.
fn in_initial_pid_namespace() -> bool {
    std::fs::read_link("/proc/self/ns/pid").is_ok_and(|ns| ns.as_os_str() == INITIAL_PID_NAMESPACE)
}

/// Whether this process surely shares init's mount namespace (unknown counts as no:
/// a bpffs this process mounts may then go with it).
fn in_init_mount_namespace() -> bool {
    if std::process::id() == 1 {
        return false;
    }
    match (
        std::fs::read_link("/proc/self/ns/mnt"),
        std::fs::read_link("/proc/1/ns/mnt"),
    ) {
        (Ok(own), Ok(init)) => own == init,
        _ => false,
    }
}

/// Init's `/sys/fs/bpf`, seen from any mount namespace (where `/proc/1` is readable).
const INIT_BPFFS: &str = "/proc/1/root/sys/fs/bpf";

fn pin_path(dir: &Path, prog_id: u32) -> PathBuf {
    dir.join(format!("{PIN_PREFIX}{prog_id}"))
}

/// After `lb_xdp` (id `prog_id`) was attached: pins its `LB_PROGRAMS` in `dir` (from
/// [`lasting_dir`]) so that the full path outlives this process, and removes the pins
/// there of programs that are gone or that this attach replaced (`replaced`).
pub fn keep(
    ebpf: &Ebpf,
    dir: &Path,
    prog_id: u32,
    replaced: Option<u32>,
) -> Result<(), DataplaneError> {
    let path = pin_path(dir, prog_id);
    let name = map_names::PROGRAMS;
    let Some(Map::ProgramArray(data)) = ebpf.map(name) else {
        return Err(DataplaneError::MissingMap { name });
    };
    if !path.exists() {
        data.pin(&path).map_err(|e| DataplaneError::Io {
            what: "pinning LB_PROGRAMS (lb_xdp's tail-call target)",
            source: io::Error::other(e.to_string()),
        })?;
    }
    let live: BTreeSet<u32> = loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect();
    for (id, stale) in pins_in(dir) {
        if id != prog_id && (Some(id) == replaced || !live.contains(&id)) {
            remove_pin(&stale);
        }
    }
    Ok(())
}

/// Removes the pin that keeps program `prog_id`'s full path (after a detach; a pin in
/// `pin_path` goes with that directory).
pub fn forget(prog_id: u32) {
    for dir in [INIT_BPFFS, "/sys/fs/bpf"] {
        remove_pin(&pin_path(Path::new(dir), prog_id));
    }
}

fn remove_pin(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        // A directory this process may not enter holds no pin it made.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ) => {}
        Err(e) => {
            tracing::warn!(pin = %path.display(), error = %e, "removing a stale full-path pin")
        }
    }
}

/// The full-path pins in `dir`: (program id, path).
fn pins_in(dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let id = name.to_str()?.strip_prefix(PIN_PREFIX)?.parse().ok()?;
            Some((id, e.path()))
        })
        .collect()
}
