//! Whether the reply a tcp probe has read so far can still match its `expect`: a
//! pattern anchored at the start (`^\+PONG`) is decided by the reply's first bytes, so a
//! server that answers wrongly and keeps the connection open fails at once instead of
//! at the timeout. An unanchored pattern may always match further on: only a match, the
//! close, `max_response` or the timeout decide it.

use regex_automata::{
    Input,
    hybrid::dfa::{Cache, DFA},
    nfa::thompson,
    util::syntax,
};

/// `expect` as a lazy DFA that tells a reply no continuation of which can match.
pub(super) struct ReplyPrefix {
    dfa: DFA,
    cache: Cache,
}

impl ReplyPrefix {
    /// `pattern` compiled as `regex::bytes` compiles it; `None` when it does not build
    /// as a lazy DFA (then nothing is decided early).
    pub fn new(pattern: &str) -> Option<Self> {
        let dfa = DFA::builder()
            .syntax(syntax::Config::new().utf8(false))
            .thompson(thompson::Config::new().utf8(false))
            .build(pattern)
            .ok()?;
        let cache = dfa.create_cache();
        Some(ReplyPrefix { dfa, cache })
    }

    /// Whether a reply can turn out not to match before it ends: only a pattern anchored
    /// at the start (every alternative begins with `^`) has replies no continuation of
    /// which matches.
    pub fn decides_early(&self) -> bool {
        self.dfa.get_nfa().is_always_start_anchored()
    }

    /// No reply that starts with `reply` matches the pattern.
    pub fn hopeless(&mut self, reply: &[u8]) -> bool {
        let Ok(mut state) = self
            .dfa
            .start_state_forward(&mut self.cache, &Input::new(reply))
        else {
            return false;
        };
        for &byte in reply {
            let Ok(next) = self.dfa.next_state(&mut self.cache, state, byte) else {
                return false;
            };
            state = next;
            if state.is_dead() {
                return true;
            }
            // A match already seen, or a byte the lazy DFA cannot decide on.
            if state.is_match() || state.is_quit() {
                return false;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchored_pattern_is_decided_by_the_first_bytes() {
        let mut p = ReplyPrefix::new(r"^\+PONG").unwrap();
        assert!(p.hopeless(b"-LOADING"));
        assert!(p.hopeless(b"+PI"));
        assert!(!p.hopeless(b""));
        assert!(!p.hopeless(b"+PO"), "may still become +PONG");
        assert!(!p.hopeless(b"+PONG\r\n"));
        assert!(p.decides_early());
    }

    #[test]
    fn an_unanchored_pattern_may_always_match_later() {
        let mut p = ReplyPrefix::new("PONG").unwrap();
        assert!(!p.hopeless(b"-LOADING Redis is loading the dataset"));
        assert!(!p.decides_early());
        let mut p = ReplyPrefix::new(r"(?m)^OK$").unwrap();
        assert!(!p.hopeless(b"ERR\n"), "a later line may still be OK");
    }

    #[test]
    fn a_whole_reply_pattern_fails_on_a_wrong_byte_anywhere() {
        let mut p = ReplyPrefix::new(r"^ok\r?\n$").unwrap();
        assert!(!p.hopeless(b"ok\r"));
        assert!(p.hopeless(b"ok!"));
        assert!(p.hopeless(b"ok\nmore"));
    }
}
