"""What `swift deploy` and `swift rollout` share: the request guard and limits (`guard`), the error
shape and handlers (`errors`), strict field types (`fields`) and the contract of an engine job —
its deadline, and its cancellation when the client leaves or asks (`jobs`). Neither server imports
HTTP plumbing from the other."""
