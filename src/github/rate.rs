//! GitHub's rate limits as its answers say them: which answers are one, and how long GitHub
//! asks to be left alone.

use reqwest::header::HeaderMap;
use reqwest::StatusCode;

/// The longest a rate limit is waited out when GitHub names no time.
const RATE_LIMIT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long GitHub asks to be left alone, when `status` and `headers` are its rate limit: a
/// `429`, or a `403` with `retry-after` or no requests remaining (GitHub's primary and
/// secondary limits). From `retry-after` (seconds), else `x-ratelimit-reset` (epoch seconds).
pub(super) fn rate_limited(status: StatusCode, headers: &HeaderMap) -> Option<std::time::Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let retry_after = header("retry-after");
    let exhausted = header("x-ratelimit-remaining") == Some(0);
    let limited = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN && (retry_after.is_some() || exhausted));
    if !limited {
        return None;
    }
    let until_reset = header("x-ratelimit-reset").and_then(|reset| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs();
        reset.checked_sub(now)
    });
    Some(
        retry_after
            .or(until_reset)
            .map_or(RATE_LIMIT_DEFAULT, std::time::Duration::from_secs),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn githubs_rate_limits_are_read_with_when_to_retry() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        let secs = |d: Option<std::time::Duration>| d.map(|d| d.as_secs());
        assert_eq!(
            secs(rate_limited(
                StatusCode::TOO_MANY_REQUESTS,
                &headers(&[("retry-after", "30")])
            )),
            Some(30)
        );
        assert_eq!(
            secs(rate_limited(
                StatusCode::FORBIDDEN,
                &headers(&[("retry-after", "7")])
            )),
            Some(7)
        );
        let reset = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 120;
        let primary = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset.to_string()),
        ]);
        let waited = secs(rate_limited(StatusCode::FORBIDDEN, &primary)).unwrap();
        assert!((118..=120).contains(&waited), "{waited}");
        assert_eq!(
            secs(rate_limited(
                StatusCode::TOO_MANY_REQUESTS,
                &HeaderMap::new()
            )),
            Some(60)
        );
        // A 403 that is no rate limit (no permission) is not one.
        assert_eq!(rate_limited(StatusCode::FORBIDDEN, &HeaderMap::new()), None);
        assert_eq!(
            rate_limited(StatusCode::OK, &headers(&[("retry-after", "1")])),
            None
        );
    }
}
