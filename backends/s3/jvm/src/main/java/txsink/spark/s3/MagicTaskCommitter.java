package txsink.spark.s3;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.commit.CommitConstants;
import org.apache.hadoop.fs.s3a.commit.files.PendingSet;
import org.apache.hadoop.fs.s3a.commit.files.SinglePendingCommit;
import org.apache.hadoop.fs.s3a.commit.files.UploadEtag;
import org.apache.hadoop.fs.s3a.commit.impl.CommitContext;
import org.apache.hadoop.fs.s3a.commit.magic.MagicS3GuardCommitter;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.JobStatus;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.spark.TaskContext;

/**
 * S3A's magic committer cut short: a task's files become multipart uploads that are
 * never completed here.
 *
 * <p>Writing under {@link #getWorkPath()} makes S3A turn each file into an upload to its
 * final key that stays pending ({@code __magic_job-<uuid>/.../__base/<relative path>}
 * names the key {@code <dest>/<relative path>}). Task commit, which Spark runs only for
 * the attempt its commit coordinator authorises, collects what the attempt uploaded into
 * a {@link TaskFiles}; nothing else is written. Job setup, job commit and job abort do
 * nothing: txsink's driver completes the uploads once its decision is durable, and
 * aborts the rest (task abort still aborts a failed attempt's own uploads).
 *
 * <p>Where S3A keeps a task's pending uploads until task commit depends on the
 * filesystem instance ({@code fs.s3a.committer.magic.track.commits.in.memory.enabled} as
 * the cached instance read it), not on the job's settings, so that is what is asked.
 */
public final class MagicTaskCommitter extends MagicS3GuardCommitter {

    private final TaskFiles files;

    MagicTaskCommitter(Path dest, TaskAttemptContext context, TaskFiles files) throws IOException {
        super(dest, context);
        this.files = files;
    }

    /** Whether the destination filesystem keeps pending uploads in memory (else in S3). */
    private boolean inMemory() throws IOException {
        return getDestFS().getConf().getBoolean(
            CommitConstants.FS_S3A_COMMITTER_MAGIC_TRACK_COMMITS_IN_MEMORY_ENABLED,
            CommitConstants.FS_S3A_COMMITTER_MAGIC_TRACK_COMMITS_IN_MEMORY_ENABLED_DEFAULT);
    }

    /** The task's context with the filesystem's own tracking mode, for loading and abort. */
    private TaskAttemptContext asTheFilesystemTracks(TaskAttemptContext context) throws IOException {
        context.getConfiguration().setBoolean(
            CommitConstants.FS_S3A_COMMITTER_MAGIC_TRACK_COMMITS_IN_MEMORY_ENABLED, inMemory());
        return context;
    }

    @Override
    public void setupJob(JobContext context) {
        // Nothing: no success marker to delete, no listing of the uploads under the
        // destination (the sink's prepared participants are there, by design).
    }

    @Override
    public void setupTask(TaskAttemptContext context) {
        // Nothing: S3A creates a file's upload without parent directories.
    }

    @Override
    public void commitTask(TaskAttemptContext context) throws IOException {
        TaskAttemptContext tracked = asTheFilesystemTracks(context);
        PendingSet pending = loadPendingCommits(tracked);
        List<SinglePendingCommit> commits = new ArrayList<>(pending.getCommits());
        try {
            files.collect(commits);
        } catch (IOException | RuntimeException e) {
            abortPendingUploads(tracked, commits);
            throw e;
        } finally {
            if (!inMemory()) {
                deleteTaskAttemptPathQuietly(context);
            }
        }
        TaskContext task = TaskContext.get();
        if (task != null) {
            // Spark counts the rows a task wrote only after task commit (its write
            // statistics); they reach the driver with the task's result, which is
            // serialized after the task's completion listeners ran.
            task.addTaskCompletionListener(new RowCounter(files));
        }
    }

    private void abortPendingUploads(TaskAttemptContext context, List<SinglePendingCommit> commits) {
        try (CommitContext commitContext = initiateTaskOperation(context)) {
            for (SinglePendingCommit c : commits) {
                commitContext.abortSingleCommit(c);
            }
        } catch (IOException e) {
            // The uploads stay pending: txsink's orphan scan aborts them.
        }
    }

    @Override
    public void commitJob(JobContext context) {
        // Never reached: NativeCommitProtocol.commitJob does not call it.
        throw new UnsupportedOperationException("txsink completes the uploads itself");
    }

    @Override
    public void abortJob(JobContext context, JobStatus.State state) {
        // Nothing: the uploads of committed tasks are aborted by txsink (the epoch is
        // never recorded, so they are orphans of it).
    }

    @Override
    public void cleanupJob(JobContext context) {
    }

    /** Sets {@link TaskFiles#rows} from Spark's write statistics once the task ends well. */
    private static final class RowCounter implements org.apache.spark.util.TaskCompletionListener {
        private final TaskFiles files;

        RowCounter(TaskFiles files) {
            this.files = files;
        }

        @Override
        public void onTaskCompletion(TaskContext context) {
            if (!context.isFailed() && !context.isInterrupted()) {
                files.rows = context.taskMetrics().outputMetrics().recordsWritten();
            }
        }
    }

    static boolean hasChecksums(SinglePendingCommit commit) {
        for (UploadEtag etag : commit.getEtags()) {
            if (etag.getChecksumAlgorithm() != null && !etag.getChecksumAlgorithm().isEmpty()) {
                return true;
            }
        }
        return false;
    }
}
