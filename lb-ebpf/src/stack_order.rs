//! An ordering hint for the BPF stack budget: a pointer the compiler takes to depend on
//! another value, so that loads through it are issued where the code reads them, not
//! hoisted ahead (into a loop's preheader, or before a chain of arithmetic) where their
//! results would wait in stack slots. docs/internals/fast-path.md, "Stack budget".

/// `p`, as a pointer the compiler takes to depend on `dep`: one register move of `p` to
/// itself (the verifier sees the same pointer). Not an empty asm statement: with no
/// instruction, its line record shares the next instruction's offset in `.BTF.ext`,
/// and the kernel refuses a program whose line records repeat an offset ("Invalid
/// line_info").
#[inline(always)]
pub fn after<T>(p: *const T, dep: u64) -> *const T {
    let mut p = p;
    // SAFETY: `p` comes out as it went in.
    // The statement passes the pointer through and reads no memory: `nomem` is right.
    #[allow(clippy::pointers_in_nomem_asm_block)]
    unsafe {
        core::arch::asm!(
            "/* {dep} */",
            "{p} = {p}",
            p = inout(reg) p,
            dep = in(reg) dep,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    p
}
