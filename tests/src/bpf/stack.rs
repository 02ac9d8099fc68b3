//! The BPF stack each program of an object needs, read from the object itself: every
//! function's frame (the deepest `r10 - N` it touches) and its BPF-to-BPF calls, summed
//! along the deepest call chain as the verifier does (each frame rounded up to 16 bytes,
//! its rule for JIT-compiled programs; 512 bytes in all). docs/internals/fast-path.md,
//! "Stack budget".

use crate::util::error::Error;
use std::collections::{BTreeMap, BTreeSet};

/// The verifier's limit for a program's deepest call chain.
pub const STACK_LIMIT: u32 = 512;

/// What the production programs may use: the limit less a margin of 64 bytes, so that
/// an unrelated change cannot tip them over unnoticed.
pub const STACK_BUDGET: u32 = STACK_LIMIT - 64;

/// One function of the object: its frame and the functions it calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Function {
    /// Section the function is in (`xdp`, `.text`, `classifier`...).
    pub section: String,
    /// The deepest stack offset it reads, writes or takes the address of, in bytes.
    pub frame: u32,
    /// Functions it calls (BPF-to-BPF calls, by symbol name).
    pub calls: BTreeSet<String>,
}

/// The functions of an object, by symbol name.
#[derive(Debug, Clone, Default)]
pub struct StackMap {
    pub functions: BTreeMap<String, Function>,
}

/// A program's deepest call chain: its functions, the program first, and the stack
/// they need together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub functions: Vec<String>,
    pub bytes: u32,
}

/// A frame as the verifier counts it in a chain (JIT: rounded up to 16 bytes).
pub fn rounded(frame: u32) -> u32 {
    frame.div_ceil(16) * 16
}

struct Elf<'a>(&'a [u8]);

impl Elf<'_> {
    fn bytes(&self, at: usize, n: usize, what: &'static str) -> Result<&[u8], Error> {
        self.0
            .get(at..at.checked_add(n).ok_or_else(|| truncated(what))?)
            .ok_or_else(|| truncated(what))
    }
    fn u16(&self, at: usize) -> Result<u16, Error> {
        let b = self.bytes(at, 2, "u16")?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&self, at: usize) -> Result<u32, Error> {
        let b = self.bytes(at, 4, "u32")?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&self, at: usize) -> Result<u64, Error> {
        let b = self.bytes(at, 8, "u64")?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn cstr(&self, at: usize) -> Result<String, Error> {
        let tail = self.0.get(at..).ok_or_else(|| truncated("string"))?;
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| truncated("string"))?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    }
}

#[derive(Clone)]
struct Section {
    name: String,
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
    info: u32,
}

#[derive(Clone)]
struct Symbol {
    name: String,
    kind: u8,
    section: usize,
    value: u64,
    size: u64,
}

const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;
const STT_FUNC: u8 = 2;
const STT_SECTION: u8 = 3;
const EM_BPF: u16 = 247;
/// `BPF_JMP | BPF_CALL`; with `src_reg` `BPF_PSEUDO_CALL` (1) a call of a BPF function.
const CALL: u8 = 0x85;
/// `BPF_LD | BPF_IMM | BPF_DW`: a 16-byte instruction.
const LDDW: u8 = 0x18;
/// `BPF_ALU64 | BPF_MOV | BPF_X` and `BPF_ALU64 | BPF_ADD | BPF_K`: `rX = r10; rX += -N`
/// takes the address of a stack object N bytes deep.
const MOV64_X: u8 = 0xbf;
const ADD64_K: u8 = 0x07;
const FP: u8 = 10;

impl StackMap {
    /// Reads every function of the BPF ELF object `obj`.
    pub fn parse(obj: &[u8]) -> Result<Self, Error> {
        let elf = Elf(obj);
        if obj.len() < 64 || &obj[..4] != b"\x7fELF" || obj[4] != 2 || obj[5] != 1 {
            return Err(not_bpf_elf());
        }
        if elf.u16(0x12)? != EM_BPF {
            return Err(not_bpf_elf());
        }
        let shoff = elf.u64(0x28)? as usize;
        let shentsize = elf.u16(0x3a)? as usize;
        let shnum = elf.u16(0x3c)? as usize;
        let shstrndx = elf.u16(0x3e)? as usize;
        let mut sections = Vec::with_capacity(shnum);
        let mut names = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let at = shoff + i * shentsize;
            names.push(elf.u32(at)? as usize);
            sections.push(Section {
                name: String::new(),
                kind: elf.u32(at + 4)?,
                offset: elf.u64(at + 0x18)? as usize,
                size: elf.u64(at + 0x20)? as usize,
                link: elf.u32(at + 0x28)?,
                info: elf.u32(at + 0x2c)?,
            });
        }
        let strtab = sections
            .get(shstrndx)
            .ok_or_else(|| truncated("section names"))?
            .offset;
        for (s, name) in sections.iter_mut().zip(names) {
            s.name = elf.cstr(strtab + name)?;
        }
        let symtab = sections
            .iter()
            .find(|s| s.kind == SHT_SYMTAB)
            .cloned()
            .ok_or_else(|| Error::Unexpected("the object has no symbol table".into()))?;
        let symstr = sections
            .get(symtab.link as usize)
            .ok_or_else(|| truncated("symbol strings"))?
            .offset;
        let mut symbols = Vec::with_capacity(symtab.size / 24);
        for i in 0..symtab.size / 24 {
            let at = symtab.offset + 24 * i;
            symbols.push(Symbol {
                name: elf.cstr(symstr + elf.u32(at)? as usize)?,
                kind: elf.bytes(at + 4, 1, "symbol")?[0] & 0xf,
                section: elf.u16(at + 6)? as usize,
                value: elf.u64(at + 8)?,
                size: elf.u64(at + 16)?,
            });
        }
        // (section, offset of a call instruction) -> the symbol its relocation names.
        let mut relocs = BTreeMap::new();
        for rel in sections.iter().filter(|s| s.kind == SHT_REL) {
            for i in 0..rel.size / 16 {
                let at = rel.offset + 16 * i;
                let sym = (elf.u64(at + 8)? >> 32) as usize;
                if let Some(s) = symbols.get(sym) {
                    relocs.insert((rel.info as usize, elf.u64(at)?), s.clone());
                }
            }
        }
        let funcs: Vec<&Symbol> = symbols.iter().filter(|s| s.kind == STT_FUNC).collect();
        let at_address = |section: usize, value: u64| {
            funcs
                .iter()
                .find(|f| f.section == section && f.value == value)
                .map(|f| f.name.clone())
        };
        let mut functions = BTreeMap::new();
        for f in &funcs {
            let Some(sec) = sections.get(f.section) else {
                continue;
            };
            if f.value + f.size > sec.size as u64 {
                return Err(truncated("function"));
            }
            let mut function = Function {
                section: sec.name.clone(),
                ..Function::default()
            };
            let mut pc = f.value;
            while pc < f.value + f.size {
                let insn = elf.bytes(sec.offset + pc as usize, 8, "instruction")?;
                let (code, dst, src) = (insn[0], insn[1] & 0xf, insn[1] >> 4);
                let off = i16::from_le_bytes([insn[2], insn[3]]) as i64;
                let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]) as i64;
                let class = code & 7;
                let deep = |o: i64| if o < 0 { (-o) as u32 } else { 0 };
                // BPF_LDX from r10, BPF_ST/BPF_STX to r10.
                if class == 1 && src == FP {
                    function.frame = function.frame.max(deep(off));
                }
                if (class == 2 || class == 3) && dst == FP {
                    function.frame = function.frame.max(deep(off));
                }
                if code == MOV64_X
                    && src == FP
                    && let Ok(next) = elf.bytes(sec.offset + pc as usize + 8, 8, "instruction")
                    && next[0] == ADD64_K
                    && next[1] & 0xf == dst
                {
                    let imm = i32::from_le_bytes([next[4], next[5], next[6], next[7]]);
                    function.frame = function.frame.max(deep(imm as i64));
                }
                if code == CALL && src == 1 {
                    let callee = match relocs.get(&(f.section, pc)) {
                        Some(s) if s.kind == STT_SECTION => {
                            at_address(s.section, (s.value as i64 + (imm + 1) * 8) as u64)
                        }
                        Some(s) => Some(s.name.clone()),
                        None => at_address(f.section, (pc as i64 + 8 + imm * 8) as u64),
                    };
                    if let Some(c) = callee {
                        function.calls.insert(c);
                    }
                }
                pc += if code == LDDW { 16 } else { 8 };
            }
            functions.insert(f.name.clone(), function);
        }
        Ok(Self { functions })
    }

    /// The deepest call chain from `name` (`None`: no such function).
    pub fn chain(&self, name: &str) -> Option<Chain> {
        self.chain_in(name, &mut Vec::new())
    }

    fn chain_in(&self, name: &str, path: &mut Vec<String>) -> Option<Chain> {
        let f = self.functions.get(name)?;
        path.push(name.to_string());
        let mut deepest: Option<Chain> = None;
        for callee in &f.calls {
            // The verifier refuses recursion; a cycle here would be a parse error.
            if path.iter().any(|p| p == callee) {
                continue;
            }
            if let Some(c) = self.chain_in(callee, path)
                && deepest.as_ref().is_none_or(|d| c.bytes > d.bytes)
            {
                deepest = Some(c);
            }
        }
        path.pop();
        let (mut functions, below) = match deepest {
            Some(c) => (c.functions, c.bytes),
            None => (Vec::new(), 0),
        };
        functions.insert(0, name.to_string());
        Some(Chain {
            functions,
            bytes: rounded(f.frame) + below,
        })
    }

    /// The programs: the functions of every section but `.text` (BPF-to-BPF callees).
    pub fn programs(&self) -> impl Iterator<Item = &str> {
        self.functions
            .iter()
            .filter(|(_, f)| f.section != ".text")
            .map(|(n, _)| n.as_str())
    }
}

fn truncated(what: &str) -> Error {
    Error::Unexpected(format!("the object is truncated ({what})"))
}

fn not_bpf_elf() -> Error {
    Error::Unexpected("not a little-endian 64-bit BPF ELF object".into())
}
