//! The official image is a base a setup script can build on: its tools are there, the user's
//! `HOME` is `/home/narya` apart from the workspace, and the user installs into `/usr/local` and
//! `/opt` without root. End to end, on each engine, with no network but loopback.

mod support;

use hyper::StatusCode;
use serde_json::json;
use support::e2e::{body, create, exec, unique_id, Backend, Host};

/// Builds and installs a C program with make, makes a Python venv (offline: the wheels venv
/// seeds pip from are in the image), and runs each tool a setup reaches for first. Any failure
/// fails the setup (`set -e`), with the step it failed at in the output.
const SETUP: &str = r#"set -euo pipefail
step() { echo "== $*"; }

step home
echo "HOME=$HOME"
[ "$HOME" = /home/narya ]
[ "$(cd ~ && pwd -P)" = /home/narya ]
[ "$(stat -c %u ~)" = 1000 ]
[ "$(getent passwd narya | cut -d: -f6)" = /home/narya ]
[ "$(pwd)" = /workspace ]
echo data > ~/.written

step "make install into /usr/local"
work=$(mktemp -d)
cd "$work"
cat > hello.c <<'EOF'
#include <stdio.h>
int main(void) { puts("hello from /usr/local"); return 0; }
EOF
printf 'PREFIX ?= /usr/local\nhello: hello.c\n\t$(CC) -O2 -o $@ hello.c\ninstall: hello\n\tinstall -D -m 0755 hello $(DESTDIR)$(PREFIX)/bin/narya-hello\n' > Makefile
make install PREFIX=/usr/local
cd /workspace
rm -rf "$work"

step "a tarball into /opt"
mkdir -p "$HOME/src/tool/bin"
printf '#!/bin/sh\necho tool\n' > "$HOME/src/tool/bin/tool"
chmod 0755 "$HOME/src/tool/bin/tool"
tar -C "$HOME/src" -cJf "$HOME/tool.tar.xz" tool
tar -C /opt -xJf "$HOME/tool.tar.xz"
[ "$(/opt/tool/bin/tool)" = tool ]

step python
python3 -m venv /home/narya/venv
[ "$(/home/narya/venv/bin/python -c 'print(1)')" = 1 ]
/home/narya/venv/bin/pip --version
python3 -m pip --version
encoding=$(python3 -c 'import locale; print(locale.getpreferredencoding())')
echo "encoding=$encoding LANG=${LANG:-}"
[ "$encoding" = UTF-8 ]

step tools
for tool in "curl --version" "wget --version" "xz --version" "zstd --version" \
    "jq --version" "file --version" "unzip -v" "zip -v" "ssh -V" "ps" "less --version" \
    "pkg-config --version" "gcc --version" "make --version"; do
    out=$($tool 2>&1) || { echo "$tool failed: $out"; exit 1; }
    echo "$tool: $(echo "$out" | head -n1)"
done
[ "$(echo bzip2 | bzip2 | bzip2 -d)" = bzip2 ]
[ "$(echo zip | gzip | gunzip)" = zip ]

step tzdata
test -f /usr/share/zoneinfo/UTC
[ "$(TZ=Asia/Tokyo date -d @0 +%H)" = 09 ]

echo "== done"
"#;

async fn a_setup_builds_and_installs_as_the_user_with_home_in_the_machine(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("image");
    let answer = create(&client, json!({"id": id, "setup": SETUP})).await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let env = body(&answer);
    let output = env["setup"]["output"].as_str().unwrap_or_default();
    assert_eq!(
        env["setup"]["state"], "succeeded",
        "setup output:\n{output}"
    );
    assert_eq!(env["status"], "ready", "{env}");
    assert!(output.ends_with("== done\n"), "setup output:\n{output}");

    // What the setup installed stays for later commands, on PATH.
    let ran = exec(&client, &id, &["narya-hello"]).await;
    assert_eq!(ran.status, StatusCode::OK);
    let ran = body(&ran);
    assert_eq!(
        (ran["exit_code"].clone(), ran["output"].clone()),
        (json!(0), json!("hello from /usr/local\n")),
        "{ran}"
    );
    let ran = body(
        &exec(
            &client,
            &id,
            &["sh", "-c", "echo $HOME; cat ~/.written; pwd"],
        )
        .await,
    );
    assert_eq!(ran["output"], "/home/narya\ndata\n/workspace\n", "{ran}");
    // The home is the machine's, not the workspace: nothing of it lands in the checkout.
    assert!(!host.workspace(&id).join(".written").exists());
    assert!(!host.workspace(&id).join("venv").exists());
    host.remove(&id).await;
}

on_every_engine!(a_setup_builds_and_installs_as_the_user_with_home_in_the_machine);
