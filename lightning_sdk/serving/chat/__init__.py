"""Chat Completions (and text completions): request bodies, the chat template that makes the prompt ids,
response bodies and their server-sent events, and the two routes. The Responses and Messages APIs are
served as the chat request they mean, so they build on this folder."""
