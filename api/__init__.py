"""The read path: leaderboard queries over HTTP, from Redis or from hot boards in memory."""
