#!/usr/bin/env bash
# commit-msg hook (.pre-commit-config.yaml): a commit's subject is at most 72 characters; figures go in the body.
subject=$(head -n 1 "$1")
if [ "${#subject}" -gt 72 ]; then
  echo "commit subject is ${#subject} characters; keep it to 72 (put the rest in the body):" >&2
  echo "  $subject" >&2
  exit 1
fi
