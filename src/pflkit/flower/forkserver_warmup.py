"""Imported by pflkit's SuperExec's fork server only (``superexec.PRELOAD``): it builds one HTTP client, so that
OpenSSL's default certificate paths are loaded once, before the ClientApps are forked.

Every ClientApp builds an httpx client for its SuperNode's runtime API. Even on that plain-HTTP link httpx makes
a default SSL context, and a process's first one costs about 17 ms on a 2-core machine (OpenSSL loading its
default verify paths); a process forked from one that has made one pays 0.3-2 ms. This module's import is that
one client: its only effect, and the reason the module exists.
"""
import httpx

httpx.Client(verify=False).close()
