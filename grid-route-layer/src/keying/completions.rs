//! OpenAI Completions `prompt`.

use super::keys::NoKeys;
use super::scan::{Kind, Scanner, TextSink};
use super::stream::{Marker, marker};

/// Writes the prompt when it is one string, or an array of exactly one string (which keys
/// alike). Token ids, arrays of token ids and batches of several prompts get no keys.
pub(super) fn prompt(s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    match s.peek_kind()? {
        Kind::String => {
            marker(out, Marker::Text);
            s.string(out)?;
            Ok(())
        }
        Kind::Array => {
            let mut items = s.begin_array()?;
            if !s.next_item(&mut items)? {
                return Err(NoKeys::NoPrompt);
            }
            match s.peek_kind()? {
                Kind::String => {
                    marker(out, Marker::Text);
                    s.string(out)?;
                }
                Kind::Number | Kind::Array => return Err(NoKeys::TokenIds),
                _ => return Err(NoKeys::unreadable("a string or token ids in the prompt")),
            }
            if s.next_item(&mut items)? {
                return Err(NoKeys::Batch);
            }
            Ok(())
        }
        _ => Err(NoKeys::unreadable("a string or an array prompt")),
    }
}
