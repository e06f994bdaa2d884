//! What a create reports while it runs: steps starting and finishing, and the clone and setup
//! output as it is produced, to whoever streams the create.

use serde::Serialize;

/// One progress event, serialised as the contract's NDJSON lines.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Progress {
    /// `{"step": "image" | "clone" | "machine" | "setup", "state": "started" | "finished"}`
    Step {
        step: &'static str,
        state: &'static str,
    },
    /// `{"step": "clone" | "setup", "output": "chunk"}`
    Output { step: &'static str, output: String },
}

impl Progress {
    pub fn started(step: &'static str) -> Progress {
        Progress::Step {
            step,
            state: "started",
        }
    }

    pub fn finished(step: &'static str) -> Progress {
        Progress::Step {
            step,
            state: "finished",
        }
    }
}

/// Turns a byte stream into text chunks without splitting a UTF-8 sequence across two of them;
/// bytes that are not UTF-8 become U+FFFD.
#[derive(Default)]
pub struct Utf8Chunks {
    pending: Vec<u8>,
}

impl Utf8Chunks {
    /// The text of `bytes` (after what was held back), holding back an incomplete sequence.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let keep = incomplete_suffix(&self.pending);
        let complete = self.pending.len() - keep;
        let text = String::from_utf8_lossy(&self.pending[..complete]).into_owned();
        self.pending.drain(..complete);
        text
    }

    /// Whatever is still held back.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// How many trailing bytes start a UTF-8 sequence that is not complete yet (0 to 3).
fn incomplete_suffix(bytes: &[u8]) -> usize {
    for back in 1..=3.min(bytes.len()) {
        let b = bytes[bytes.len() - back];
        if b & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back for the lead
        }
        let needed = if b >= 0xF0 {
            4
        } else if b >= 0xE0 {
            3
        } else if b >= 0xC0 {
            2
        } else {
            1
        };
        return if needed > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialise_as_the_contract_says() {
        assert_eq!(
            serde_json::to_string(&Progress::started("image")).unwrap(),
            r#"{"step":"image","state":"started"}"#
        );
        assert_eq!(
            serde_json::to_string(&Progress::Output {
                step: "setup",
                output: "hi\n".into()
            })
            .unwrap(),
            r#"{"step":"setup","output":"hi\n"}"#
        );
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        let text = "héllo → wörld 🎉";
        let bytes = text.as_bytes();
        for split in 0..bytes.len() {
            let mut chunks = Utf8Chunks::default();
            let mut out = chunks.push(&bytes[..split]);
            out += &chunks.push(&bytes[split..]);
            out += &chunks.finish();
            assert_eq!(out, text, "split at {split}");
        }
        let mut chunks = Utf8Chunks::default();
        assert_eq!(chunks.push(b"a\xffb"), "a\u{fffd}b");
    }
}
