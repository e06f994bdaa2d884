//! The output group: every process's output arrives whole, also when many run at once on a busy
//! host (the back end must not answer before what the process wrote has come through).

use futures_util::StreamExt;

use super::{check, text, CaseFn, Context, Outcome};

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    vec![case!("process", many_execs_each_answer_their_whole_output)]
}

/// How many processes the case runs, and how many at a time.
const EXECS: usize = 120;
const AT_ONCE: usize = 8;

/// What process `n` prints: a line of its own, a second one after a short pause (so it is not
/// all written before the process is fully started), and a line on stderr.
fn script(n: usize) -> String {
    let pause = n % 3;
    format!("echo first-{n}; sleep 0.0{pause}; echo second-{n}; echo third-{n} >&2")
}

async fn many_execs_each_answer_their_whole_output(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let id = id.as_str();
    let mut answers = futures_util::stream::iter(0..EXECS)
        .map(|n| async move { (n, c.sh(id, &script(n)).await) })
        .buffer_unordered(AT_ONCE);
    let mut wrong = Vec::new();
    while let Some((n, answer)) = answers.next().await {
        let out = answer?;
        // stderr may come through beside stdout rather than after it (Docker's two streams).
        let mut lines: Vec<String> = text(&out)
            .split_inclusive('\n')
            .map(str::to_owned)
            .collect();
        lines.sort();
        let want = [
            format!("first-{n}\n"),
            format!("second-{n}\n"),
            format!("third-{n}\n"),
        ];
        if out.exit_code != Some(0) || out.output_truncated || lines != want {
            wrong.push(format!("#{n}: {:?} exit {:?}", text(&out), out.exit_code));
        }
    }
    check(wrong.is_empty(), || {
        format!(
            "{} of {EXECS} processes answered other than their output: {}",
            wrong.len(),
            wrong.join("; ")
        )
    })
}
