"""Rollouts for online RL: multi-turn schedulers and the loop that turns a prompt into a trajectory."""
