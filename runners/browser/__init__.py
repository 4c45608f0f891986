"""One headless Chromium per episode, its task pages served on loopback, and a small CDP client.

`browser_episode(site_dir)` serves `site_dir` on 127.0.0.1 (a static file server in hrl's process), starts Chromium
with a remote-debugging endpoint (CDP) in a fresh profile, and yields a `Browser`: hrl's grader holds the browser's
own endpoint (`direct_url`), the agent's tools get `cdp_url`, a relay in front of it that refuses the commands that
could rewrite the task's code or files (`refusal`). Both see the same page. On exit the browser's whole process group is killed and the
profile removed, whatever happened.

What the browser reaches: hrl's own CDP session intercepts every request (`Fetch`) and fails those outside the
allowed origins (the task's server, and the proxy where given); non-loopback hosts also go to a dead proxy, so a
request the interception missed fails too. An agent's CDP session cannot turn hrl's interception off (CDP domains are
per session).

`cdp`: the CDP client, `refusal` and hrl's request guard; `chromium`: the browser's process and `Browser`; `relay`:
the agent's relay, the task's pages served, the tunnels to and from a sandbox; `episode`: where the browser runs and
`browser_episode`.
"""

from hrl.runners.browser.cdp import CDP, REFUSED_PREFIXES, open_tab, refusal, wait_until
from hrl.runners.browser.chromium import CHROMIUM_FLAGS, Browser, BrowserError, find_chromium, live_in_group
from hrl.runners.browser.episode import (
    BROWSER_FILE,
    WHERE_HELP,
    BrowserWhere,
    EpisodeFolders,
    InSandbox,
    browser_episode,
    check_where,
    closes_browser,
    provision_browser,
    sandbox_for,
    tell_agent,
)
from hrl.runners.browser.relay import tunnel_endpoint

__all__ = [
    "BROWSER_FILE",
    "CDP",
    "CHROMIUM_FLAGS",
    "REFUSED_PREFIXES",
    "WHERE_HELP",
    "Browser",
    "BrowserError",
    "BrowserWhere",
    "EpisodeFolders",
    "InSandbox",
    "browser_episode",
    "check_where",
    "closes_browser",
    "find_chromium",
    "live_in_group",
    "open_tab",
    "provision_browser",
    "refusal",
    "sandbox_for",
    "tell_agent",
    "tunnel_endpoint",
    "wait_until",
]
