//! `lb_xdp_full`, the second XDP program: loaded next to `lb_xdp` and put into
//! `LB_PROGRAMS` before `lb_xdp` can run, and kept there after the agent exits.
//!
//! The kernel empties a `PROG_ARRAY` when its last user reference goes (an open fd or a
//! pin): the attached `lb_xdp` outlives the agent (netlink attach), so once attached the
//! array is pinned as `lb_full_path_<lb_xdp's id>` in init's bpffs (`/proc/1/root/sys/
//! fs/bpf`, the same directory as `/sys/fs/bpf` outside a private mount namespace).
//! The next agent's `lb_xdp` has an array of its own (never adopted), pinned under its
//! own id; the pins of programs that are gone or were just replaced are removed, and
//! `lb-agent detach` removes the detached program's pin. docs/fast-path.md, "Two
//! programs".

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
use lb_common::{FULL_PATH_INDEX, FULL_PROGRAM_NAME, map_names};

use super::{DataplaneError, pin};

/// Pin name prefix (followed by `lb_xdp`'s program id).
const PIN_PREFIX: &str = "lb_full_path_";

/// Loads `lb_xdp_full` (the verifier runs) and puts it into `LB_PROGRAMS`.
pub fn load(ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
    let program_err = |source| DataplaneError::Program {
        name: FULL_PROGRAM_NAME,
        source,
    };
    let prog: &mut Xdp = ebpf
        .program_mut(FULL_PROGRAM_NAME)
        .ok_or(DataplaneError::MissingProgram {
            name: FULL_PROGRAM_NAME,
        })?
        .try_into()
        .map_err(program_err)?;
    prog.load().map_err(program_err)?;
    fill(ebpf)
}

/// Puts the loaded `lb_xdp_full` into `LB_PROGRAMS` (again: fixtures empty it).
pub fn fill(ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
    let program_err = |source| DataplaneError::Program {
        name: FULL_PROGRAM_NAME,
        source,
    };
    let prog: &mut Xdp = ebpf
        .program_mut(FULL_PROGRAM_NAME)
        .ok_or(DataplaneError::MissingProgram {
            name: FULL_PROGRAM_NAME,
        })?
        .try_into()
        .map_err(program_err)?;
    let fd = prog
        .fd()
        .map_err(program_err)?
        .try_clone()
        .map_err(|source| DataplaneError::Io {
            what: "duplicating lb_xdp_full's fd",
            source,
        })?;
    let name = map_names::PROGRAMS;
    let map = ebpf
        .map_mut(name)
        .ok_or(DataplaneError::MissingMap { name })?;
    let mut array =
        ProgramArray::try_from(map).map_err(|source| DataplaneError::Map { name, source })?;
    array
        .set(FULL_PATH_INDEX, &fd, 0)
        .map_err(|source| DataplaneError::Map { name, source })
}

/// Where the pins live: init's bpffs if this process can reach it, else its own.
fn pin_dir() -> Result<PathBuf, DataplaneError> {
    for dir in ["/proc/1/root/sys/fs/bpf", "/sys/fs/bpf"] {
        if pin::is_bpffs(Path::new(dir)) {
            return Ok(PathBuf::from(dir));
        }
    }
    let dir = Path::new("/sys/fs/bpf");
    pin::PinDir::prepare(dir)?;
    Ok(dir.to_path_buf())
}

fn pin_path(dir: &Path, prog_id: u32) -> PathBuf {
    dir.join(format!("{PIN_PREFIX}{prog_id}"))
}

/// After `lb_xdp` (id `prog_id`) was attached: pins its `LB_PROGRAMS` so that the
/// full path outlives this process, and removes the pins of programs that are gone or
/// that this attach replaced (`replaced`).
pub fn keep(ebpf: &Ebpf, prog_id: u32, replaced: Option<u32>) -> Result<(), DataplaneError> {
    let dir = pin_dir()?;
    let path = pin_path(&dir, prog_id);
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
    for (id, stale) in pins_in(&dir) {
        if id != prog_id && (Some(id) == replaced || !live.contains(&id)) {
            remove_pin(&stale);
        }
    }
    Ok(())
}

/// Removes the pin that keeps program `prog_id`'s full path (after a detach).
pub fn forget(prog_id: u32) {
    if let Ok(dir) = pin_dir() {
        remove_pin(&pin_path(&dir, prog_id));
    }
}

fn remove_pin(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
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
