//! How a stdio server's process is started: confined, dying with this process, in a group of
//! its own where the kernel lets it have one.

use super::*;

impl McpServer {
    /// Spawns a stdio server's process confined and dying with this process, leading a process
    /// group of its own when `own_group`. The outer error is the sandbox's or the config's; the
    /// inner one the spawn's, which the caller may answer by starting it again without a group.
    pub(super) fn spawn_stdio(
        &self,
        own_group: bool,
    ) -> Result<std::io::Result<(StdioChild, Option<tokio::process::ChildStderr>)>, McpError> {
        let config = &self.inner.config;
        let start_error = |reason: String| McpError::Start {
            server: config.name.clone(),
            reason,
        };
        let Transport::Stdio {
            command,
            env,
            cwd,
            sandbox,
            read_only,
        } = &config.transport
        else {
            return Err(start_error("not a stdio server".into()));
        };
        let Some((program, args)) = command.split_first() else {
            return Err(start_error("the command is empty".into()));
        };
        let sandbox = *sandbox;
        // Its writable root is its working folder.
        let root = match cwd {
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir().map_err(|e| McpError::Start {
                server: config.name.clone(),
                reason: e.to_string(),
            })?,
        };
        // The server and all it starts die with this process, as a tool call's tree does: a
        // killed agentloop can stop nothing, and a server left running (or what it started in
        // the background) would go on acting for a run that is over, or that another process
        // resumed. The pid rmcp sees is the supervisor's, which leads the group below and exits
        // as the server did, so a normal shutdown (stdin closed, SIGTERM to the group, then
        // SIGKILL to it) is unchanged; a server that exits leaves nothing running in its group.
        let mut confinement = agentloop_sandbox::Sandbox::new(sandbox)
            .writable(root)
            .read_only(read_only.iter().cloned())
            .prepare()
            .map_err(|e| McpError::Sandbox {
                server: config.name.clone(),
                code: e.code(),
                reason: e.to_string(),
            })?
            .dying_with_parent();
        if let Some(note) = confinement.note() {
            tracing::warn!(server = %config.name, "{note}");
        }
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).env_clear().envs(inherited_env());
        for (key, template) in env {
            cmd.env(
                key,
                expand_template(&config.name, key, template, |v| std::env::var(v).ok())?,
            );
        }
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        confinement.install(cmd.as_std_mut());
        // The previous run's folder (a restart, or a start refused its group) goes; this one
        // stays while it runs.
        *self
            .inner
            .confinement
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(confinement);
        let mut cmd = process_wrap::tokio::CommandWrap::from(cmd);
        if own_group {
            // A group of its own, led by the supervisor: a server started through `npx`, `uvx`
            // or a shell dies whole when it is stopped, leaving no grandchild behind.
            cmd.wrap(process_wrap::tokio::ProcessGroup::leader());
        }
        cmd.command_mut()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.inner.oversized.store(false, Ordering::Release);
        let over = Arc::clone(&self.inner.oversized);
        Ok(cmd.spawn().and_then(|mut child| {
            let stderr = child.inner_mut().stderr().take();
            Ok((
                StdioChild::new(child, config.max_message_bytes(), over)?,
                stderr,
            ))
        }))
    }
}
