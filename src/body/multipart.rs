//! The `model` field of a `multipart/form-data` body (vLLM's audio routes),
//! found without decoding the rest: the parts are split at the boundary the
//! `Content-Type` names, and only the headers of each part are read until
//! the one named `model`. Files are skipped as bytes, never copied.

use std::borrow::Cow;

use memchr::memmem;

use super::BodyError;

/// The `model` field of `body`, sent with `content_type`.
pub fn model<'a>(content_type: &[u8], body: &'a [u8]) -> Result<Cow<'a, str>, BodyError> {
    let boundary = boundary(content_type).ok_or(BodyError::NotMultipart)?;
    let delimiter = [b"--", boundary].concat();
    let finder = memmem::Finder::new(&delimiter);
    let mut at = finder.find(body).ok_or(BodyError::NotMultipart)? + delimiter.len();
    loop {
        let rest = &body[at..];
        // `--` after a delimiter closes the body.
        if rest.starts_with(b"--") {
            return Err(BodyError::NoModel);
        }
        let rest = rest.strip_prefix(b"\r\n").ok_or(BodyError::NotMultipart)?;
        let head_end = memmem::find(rest, b"\r\n\r\n").ok_or(BodyError::NotMultipart)?;
        let content = &rest[head_end + 4..];
        let next = finder.find(content).ok_or(BodyError::NotMultipart)?;
        if is_model(&rest[..head_end]) {
            // The value ends with the CRLF before the next delimiter.
            let value = content[..next]
                .strip_suffix(b"\r\n")
                .ok_or(BodyError::NotMultipart)?;
            return match std::str::from_utf8(value) {
                Ok(m) if !m.is_empty() => Ok(Cow::Borrowed(m)),
                _ => Err(BodyError::BadModel),
            };
        }
        at = body.len() - content.len() + next + delimiter.len();
    }
}

/// The `boundary` parameter of a `multipart/form-data` content type.
fn boundary(content_type: &[u8]) -> Option<&[u8]> {
    let text = std::str::from_utf8(content_type).ok()?;
    let mut params = text.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        let value = value.trim().trim_matches('"');
        let ok = name.trim().eq_ignore_ascii_case("boundary") && (1..=70).contains(&value.len());
        ok.then_some(value.as_bytes())
    })
}

/// Whether a part's headers say `Content-Disposition: form-data; name="model"`.
fn is_model(headers: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(headers) else {
        return false;
    };
    text.split("\r\n").any(|line| {
        let Some((name, value)) = line.split_once(':') else {
            return false;
        };
        name.trim().eq_ignore_ascii_case("content-disposition")
            && value.split(';').skip(1).any(|p| {
                let (k, v) = p.split_once('=').unwrap_or(("", ""));
                k.trim().eq_ignore_ascii_case("name") && v.trim().trim_matches('"') == "model"
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CT: &[u8] = b"multipart/form-data; boundary=XyZ";

    fn form(parts: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (headers, content) in parts {
            out.extend_from_slice(b"--XyZ\r\n");
            out.extend_from_slice(headers.as_bytes());
            out.extend_from_slice(b"\r\n\r\n");
            out.extend_from_slice(content);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--XyZ--\r\n");
        out
    }

    const FILE: &str = "Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav";
    const MODEL: &str = "Content-Disposition: form-data; name=\"model\"";

    #[test]
    fn the_model_after_a_file() {
        // A file whose bytes look like a part of their own.
        let audio = b"RIFF\r\n--Xy\r\n\x00\xff name=\"model\"\r\n\r\nfake";
        let body = form(&[
            (FILE, audio),
            (MODEL, b"whisper-1"),
            ("Content-Disposition: form-data; name=\"language\"", b"en"),
        ]);
        assert_eq!(model(CT, &body).unwrap(), "whisper-1");
        let quoted = b"multipart/form-data; charset=utf-8; boundary=\"XyZ\"";
        assert_eq!(model(quoted, &body).unwrap(), "whisper-1");
    }

    #[test]
    fn bad_forms_are_errors_not_panics() {
        let no_model = form(&[(FILE, b"x")]);
        assert_eq!(model(CT, &no_model), Err(BodyError::NoModel));
        assert_eq!(
            model(b"application/json", &no_model),
            Err(BodyError::NotMultipart)
        );
        assert_eq!(model(CT, &form(&[(MODEL, b"")])), Err(BodyError::BadModel));
        assert_eq!(
            model(CT, &form(&[(MODEL, b"\xff")])),
            Err(BodyError::BadModel)
        );
        let body = form(&[(MODEL, b"m")]);
        for cut in 0..body.len() {
            let _ = model(CT, &body[..cut]);
        }
        assert_eq!(
            model(CT, b"--XyZ\r\nno end of headers"),
            Err(BodyError::NotMultipart)
        );
    }
}
