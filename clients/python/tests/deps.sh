#!/bin/sh
# What the Python client's tests need, installed with apt-get (through sudo
# unless root) on Debian and Ubuntu when missing: python3 (3.10 or newer) and
# openssl (the TLS scenario's certificates); and for the install test,
# python3-venv (without it the test is skipped). Elsewhere it says what is missing and stops when it is required.
set -eu
PYTHON=${PYTHON:-python3}
need=""
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || need="$need python3"
command -v openssl >/dev/null || need="$need openssl"
required=$need
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || need="$need python3-venv"
[ -z "$need" ] && exit 0
if command -v apt-get >/dev/null; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		if ! command -v sudo >/dev/null; then
			echo "test-python: missing$need; installing needs root: sudo apt-get install$need" >&2
			[ -z "$required" ] && exit 0 || exit 1
		fi
		sudo=sudo
	fi
	echo "test-python: installing$need: ${sudo:+$sudo }apt-get install -y$need" >&2
	$sudo apt-get update -qq && $sudo apt-get install -y -qq $need
elif [ -n "$required" ]; then
	echo "test-python: missing$required (Python 3.10 or newer, openssl): install them and run again" >&2
	exit 1
fi
